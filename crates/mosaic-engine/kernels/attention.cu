// Fused attention, forward and backward: FlashAttention-2 (Dao, ICLR 2024, Algorithms 1 and 2)
// on bf16 tensor cores through the WMMA API. The `tokens²` scores never reach device memory:
// each block streams tiles of keys and values through shared memory, keeps a running maximum and
// sum per query row (online softmax), and the backward pass recomputes the probabilities from
// the forward's log-sum-exp. This replaces the engine's composed attention on a GPU (two
// batched GEMMs around a materialised softmax, and its backward's five more passes over the
// scores), which the H200 measurements of 2026-11-26 found the largest cost of a step.
//
// Layout: q, k and v are read where the qkv projection wrote them, bf16 `[batch, tokens, 3,
// heads, D]`, its bias (f32, bq, bk and bv of `[3, heads, D]`) added as each tile is loaded,
// and o is written where the output projection reads it, `[batch, tokens, heads, D]`, so no
// copy rearranges them around the kernels (as FlashAttention's own interface takes strided q,
// k, v) and no pass adds the bias. Every matrix is thus rows of D values, one a token, `ld` elements apart
// (3·heads·D for q, k, v and their gradients, heads·D for o, dO and dq's accumulator), head h
// of a row h·D from its start: the kernels take pointers to head 0 of token 0 of sample 0. The
// scores are `scale · q·kᵀ`; lse and the row dots are f32 `[batch, tokens, heads]`, the row
// order of o; dq accumulates in f32 (zeroed by the host) through atomics, as FlashAttention-2
// does, and is cast to bf16 into its place by `mosaic_f32_to_bf16_rows`. D (the head
// dimension) is a multiple of 16 up to 128, one kernel each, so every row of a head starts on
// a 32-byte boundary of a 32-byte-aligned allocation, as the 16-byte tile loads need. Every
// matrix product is WMMA 16×16×16 (bf16 in, f32 accumulate) between tiles in shared memory;
// the elementwise work (masking, exponentials, rescaling) reads and writes shared memory, so
// nothing depends on the fragments' private register layout. Every address handed to WMMA is a
// multiple of 32 bytes and every leading dimension a multiple of 16 elements, as the API
// requires.
//
// Compiled to a fatbin by the engine's build script, for the GPU build only.

#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

// The block's dynamic shared memory (a CPU emulation of this file, `kernels/emulated/`, defines
// its own).
#ifndef DYNAMIC_SMEM
#define DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define WARPS 4
#define THREADS (WARPS * 32)
// Query rows per forward block (16 per warp) and per backward tile; keys per forward tile and
// per backward block (16 per warp). Equal, so a causal block's tiles end at its own index.
#define TILE 64
#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF (__int_as_float(0x7f800000))

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

// acc += A · B for a 16×K tile A and a K×16 tile B in shared memory, stored row- or
// column-major (LA, LB) with leading dimensions lda and ldb.
template <int K, class LA, class LB>
__device__ __forceinline__ void mma(Acc &acc, const bf16 *a, int lda, const bf16 *b, int ldb) {
    constexpr bool a_rows = std::is_same<LA, wmma::row_major>::value;
    constexpr bool b_rows = std::is_same<LB, wmma::row_major>::value;
    for (int kk = 0; kk < K / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> fb;
        wmma::load_matrix_sync(fa, a + (a_rows ? kk * 16 : kk * 16 * lda), lda);
        wmma::load_matrix_sync(fb, b + (b_rows ? kk * 16 * ldb : kk * 16), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// The 16×16 f32 tile C (row-major in shared memory, leading dimension ldc) = A · B, or
// C += A · B when `add`.
template <int K, class LA, class LB>
__device__ __forceinline__ void product(float *c, int ldc, bool add, const bf16 *a, int lda,
                                        const bf16 *b, int ldb) {
    Acc acc;
    if (add)
        wmma::load_matrix_sync(acc, c, ldc, wmma::mem_row_major);
    else
        wmma::fill_fragment(acc, 0.f);
    mma<K, LA, LB>(acc, a, lda, b, ldb);
    wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
}

// The maximum and the sum of a value over the 32 lanes of a warp, on every lane.
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

typedef wmma::row_major Row;
typedef wmma::col_major Col;

// Copies rows row0 … row0+TILE of a [T, D] bf16 matrix whose rows lie `ld` elements apart
// into a [TILE, D] tile, 16 bytes a load, with `bias` (D f32 values, where given) added to
// every row, in f32 and rounded to bf16 as the projection's bias add would store it; rows past
// T become zeros.
template <int D>
__device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, int ld, int row0, int T,
                                          const float *bias = nullptr) {
    const int per_row = D / 8;
    for (int i = threadIdx.x; i < TILE * per_row; i += THREADS) {
        const int r = i / per_row, c = (i % per_row) * 8;
        int4 v = make_int4(0, 0, 0, 0);
        if (row0 + r < T) {
            v = *reinterpret_cast<const int4 *>(src + (size_t)(row0 + r) * ld + c);
            if (bias) {
                bf16 *e = reinterpret_cast<bf16 *>(&v);
#pragma unroll
                for (int j = 0; j < 8; ++j) e[j] = __float2bfloat16(__bfloat162float(e[j]) + bias[c + j]);
            }
        }
        *reinterpret_cast<int4 *>(dst + r * D + c) = v;
    }
}

// Where the (sample, head) of block row blockIdx.y starts: token 0 of its head in q, k, v
// (rows ld_qkv apart) and in o, dO and dq's accumulator (rows ld_o apart), its token 0's
// index in lse and the row dots, whose tokens lie `heads` apart, and its first column.
struct Head {
    size_t qkv, o, row, bias;  // and its columns' offset in a row of biases
};

__device__ __forceinline__ Head head_of(int T, int heads, int D, int ld_qkv, int ld_o) {
    const size_t b = blockIdx.y / heads, h = blockIdx.y % heads;
    return {b * T * ld_qkv + h * D, b * T * ld_o + h * D, b * T * heads + h, h * D};
}

// Bytes of dynamic shared memory the forward kernel of head dimension D takes.
#define FWD_SMEM(D) (3 * TILE * (D) * 2 + TILE * TILE * 4 + TILE * TILE * 2 + TILE * (D) * 4)

// One block: TILE query rows of one (sample, head); warp w owns rows 16w … 16w+15 and walks
// them one at a time, its lanes along the row (lane c reads columns c, c + 32, …), so that the
// lanes of a warp touch 32 consecutive words of shared memory, one per bank. Each lane keeps
// every row's running maximum and sum (the same values on every lane).
template <int D>
__device__ __forceinline__ void flash_forward(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                              const bf16 *__restrict__ v, const float *__restrict__ bq,
                                              const float *__restrict__ bk, const float *__restrict__ bv,
                                              int ld_qkv, bf16 *__restrict__ o, int ld_o,
                                              float *__restrict__ lse, int T, int heads, int causal,
                                              float scale) {
    DYNAMIC_SMEM(smem);
    bf16 *Qs = reinterpret_cast<bf16 *>(smem);       // [TILE, D]
    bf16 *Ks = Qs + TILE * D;                        // [TILE, D]
    bf16 *Vs = Ks + TILE * D;                        // [TILE, D]
    float *Ss = reinterpret_cast<float *>(Vs + TILE * D);  // scores [TILE, TILE]
    bf16 *Ps = reinterpret_cast<bf16 *>(Ss + TILE * TILE);  // probabilities [TILE, TILE]
    float *Os = reinterpret_cast<float *>(Ps + TILE * TILE);  // output accumulator [TILE, D]

    const int q0 = blockIdx.x * TILE;
    const Head start = head_of(T, heads, D, ld_qkv, ld_o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_tile<D>(Qs, q + start.qkv, ld_qkv, q0, T, bq + start.bias);
    for (int i = threadIdx.x; i < TILE * D; i += THREADS) Os[i] = 0.f;
    float m[16], l[16];
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
        m[rr] = NEG_INF;
        l[rr] = 0.f;
    }
    int tiles = (T + TILE - 1) / TILE;
    if (causal) tiles = min(tiles, (int)blockIdx.x + 1);
    __syncthreads();

    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * TILE;
        load_tile<D>(Ks, k + start.qkv, ld_qkv, k0, T, bk + start.bias);
        load_tile<D>(Vs, v + start.qkv, ld_qkv, k0, T, bv + start.bias);
        __syncthreads();

        // S = Q Kᵀ for the warp's 16 rows.
        for (int n = 0; n < TILE / 16; ++n)
            product<D, Row, Col>(Ss + warp * 16 * TILE + n * 16, TILE, false, Qs + warp * 16 * D, D,
                                 Ks + n * 16 * D, D);
        __syncwarp();

        // Online softmax, row by row: mask, new running maximum, probabilities, rescale what
        // came before.
#pragma unroll
        for (int rr = 0; rr < 16; ++rr) {
            const int row = warp * 16 + rr, qi = q0 + row;
            const float *srow = Ss + row * TILE;
            float s[TILE / 32];
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < TILE / 32; ++j) {
                const int key = k0 + lane + 32 * j;
                s[j] = (key >= T || (causal && key > qi)) ? NEG_INF : scale * srow[lane + 32 * j];
                mx = fmaxf(mx, s[j]);
            }
            const float m_new = fmaxf(m[rr], warp_max(mx));
            // -inf only while every key seen so far is masked: then every weight is 0.
            const float m_use = m_new == NEG_INF ? 0.f : m_new;
            const float alpha = __expf(m[rr] - m_use);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < TILE / 32; ++j) {
                const float p = __expf(s[j] - m_use);
                sum += p;
                Ps[row * TILE + lane + 32 * j] = __float2bfloat16(p);
            }
            l[rr] = l[rr] * alpha + warp_sum(sum);
            m[rr] = m_new;
            for (int c = lane; c < D; c += 32) Os[row * D + c] *= alpha;
        }
        __syncwarp();

        // O += P V for the warp's 16 rows.
        for (int t = 0; t < D / 16; ++t)
            product<TILE, Row, Row>(Os + warp * 16 * D + t * 16, D, true, Ps + warp * 16 * TILE, TILE,
                                    Vs + t * 16, D);
        __syncthreads();  // every warp is done with this tile's keys and values
    }

#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
        const int row = warp * 16 + rr, qi = q0 + row;
        if (qi >= T) continue;
        const float inv = 1.f / l[rr];
        bf16 *out = o + start.o + (size_t)qi * ld_o;
        for (int c = lane; c < D; c += 32) out[c] = __float2bfloat16(Os[row * D + c] * inv);
        if (lane == 0) lse[start.row + (size_t)qi * heads] = m[rr] + __logf(l[rr]);
    }
}

// Bytes of dynamic shared memory the backward kernel of head dimension D takes.
#define BWD_SMEM(D) \
    (4 * TILE * (D) * 2 + 2 * TILE * (D) * 4 + TILE * TILE * 4 + 2 * TILE * TILE * 2 + \
     WARPS * 256 * 4 + 2 * TILE * 4)

// One block: TILE keys of one (sample, head), warp w owning keys 16w … 16w+15; it walks the
// query tiles that can see them, accumulates dK and dV in shared memory and adds its share of
// dQ to device memory atomically. `dd` holds each query row's Σ dO·O. Elementwise work walks
// rows with the lanes along them, as in the forward kernel.
template <int D>
__device__ __forceinline__ void flash_backward(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                               const bf16 *__restrict__ v, const float *__restrict__ bq,
                                               const float *__restrict__ bk, const float *__restrict__ bv,
                                               int ld_qkv,
                                               const bf16 *__restrict__ dout, int ld_o,
                                               const float *__restrict__ lse, const float *__restrict__ dd,
                                               float *__restrict__ dq, bf16 *__restrict__ dk,
                                               bf16 *__restrict__ dv, int T, int heads, int causal,
                                               float scale) {
    DYNAMIC_SMEM(smem);
    bf16 *Ks = reinterpret_cast<bf16 *>(smem);  // [TILE keys, D]
    bf16 *Vs = Ks + TILE * D;                   // [TILE keys, D]
    bf16 *Qs = Vs + TILE * D;                   // [TILE queries, D]
    bf16 *dOs = Qs + TILE * D;                  // [TILE queries, D]
    float *dKs = reinterpret_cast<float *>(dOs + TILE * D);  // [TILE keys, D]
    float *dVs = dKs + TILE * D;                              // [TILE keys, D]
    float *Ps32 = dVs + TILE * D;                // Sᵀ, then Pᵀ in f32 [TILE keys, TILE queries]
    bf16 *Ps = reinterpret_cast<bf16 *>(Ps32 + TILE * TILE);  // Pᵀ [TILE keys, TILE queries]
    bf16 *dSs = Ps + TILE * TILE;                              // dSᵀ [TILE keys, TILE queries]
    float *scratch = reinterpret_cast<float *>(dSs + TILE * TILE);  // [WARPS][16, 16]
    float *lse_s = scratch + WARPS * 256;                            // [TILE queries]
    float *dd_s = lse_s + TILE;                                      // [TILE queries]

    const int k0 = blockIdx.x * TILE;
    const Head start = head_of(T, heads, D, ld_qkv, ld_o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // In a warp's 16 × 16 scratch tile, lanes 0–15 take an even row and 16–31 the odd one
    // after it: 32 distinct banks.
    const int pair = lane / 16, col = lane % 16;
    float *mine = scratch + warp * 256;

    load_tile<D>(Ks, k + start.qkv, ld_qkv, k0, T, bk + start.bias);
    load_tile<D>(Vs, v + start.qkv, ld_qkv, k0, T, bv + start.bias);
    for (int i = threadIdx.x; i < TILE * D; i += THREADS) dKs[i] = dVs[i] = 0.f;
    const int tiles = (T + TILE - 1) / TILE;

    for (int it = causal ? (int)blockIdx.x : 0; it < tiles; ++it) {
        const int q0 = it * TILE;
        __syncthreads();  // the previous tile's Qs, dOs and dSs are no longer read
        load_tile<D>(Qs, q + start.qkv, ld_qkv, q0, T, bq + start.bias);
        load_tile<D>(dOs, dout + start.o, ld_o, q0, T);
        for (int i = threadIdx.x; i < TILE; i += THREADS) {
            const bool in = q0 + i < T;
            const size_t row = start.row + (size_t)(q0 + i) * heads;
            lse_s[i] = in ? lse[row] : POS_INF;
            dd_s[i] = in ? dd[row] : 0.f;
        }
        __syncthreads();

        // Sᵀ = K Qᵀ for the warp's 16 keys (unscaled).
        for (int n = 0; n < TILE / 16; ++n)
            product<D, Row, Col>(Ps32 + warp * 16 * TILE + n * 16, TILE, false, Ks + warp * 16 * D, D,
                                 Qs + n * 16 * D, D);
        __syncwarp();

        // Pᵀ = exp(scale·Sᵀ − lse), 0 where masked, in f32 (for dS) and bf16 (for dV).
        for (int rr = 0; rr < 16; ++rr) {
            const int krow = warp * 16 + rr, key = k0 + krow;
            for (int qq = lane; qq < TILE; qq += 32) {
                const int qi = q0 + qq, at = krow * TILE + qq;
                const bool masked = key >= T || qi >= T || (causal && key > qi);
                const float p = masked ? 0.f : __expf(scale * Ps32[at] - lse_s[qq]);
                Ps32[at] = p;
                Ps[at] = __float2bfloat16(p);
            }
        }
        __syncwarp();

        // dV += Pᵀ dO.
        for (int t = 0; t < D / 16; ++t)
            product<TILE, Row, Row>(dVs + warp * 16 * D + t * 16, D, true, Ps + warp * 16 * TILE, TILE,
                                    dOs + t * 16, D);

        // dPᵀ = V dOᵀ, 16 queries at a time, and at once dSᵀ = Pᵀ ⊙ (dPᵀ − Σ dO·O).
        for (int n = 0; n < TILE / 16; ++n) {
            product<D, Row, Col>(mine, 16, false, Vs + warp * 16 * D, D, dOs + n * 16 * D, D);
            __syncwarp();
            for (int r = pair; r < 16; r += 2) {
                const int qq = n * 16 + col, at = (warp * 16 + r) * TILE + qq;
                dSs[at] = __float2bfloat16(Ps32[at] * (mine[r * 16 + col] - dd_s[qq]));
            }
            __syncwarp();
        }

        // dK += dSᵀ Q (scaled once, when written).
        for (int t = 0; t < D / 16; ++t)
            product<TILE, Row, Row>(dKs + warp * 16 * D + t * 16, D, true, dSs + warp * 16 * TILE, TILE,
                                    Qs + t * 16, D);
        __syncthreads();  // every warp's dSᵀ is written

        // dQ += scale · dS K for queries 16w … 16w+15 of the tile, over the block's TILE keys: dS is
        // dSᵀ read column-major.
        for (int t = 0; t < D / 16; ++t) {
            product<TILE, Col, Row>(mine, 16, false, dSs + warp * 16, TILE, Ks + t * 16, D);
            __syncwarp();
            for (int r = pair; r < 16; r += 2) {
                const int qi = q0 + warp * 16 + r;
                if (qi < T) atomicAdd(dq + start.o + (size_t)qi * ld_o + t * 16 + col, scale * mine[r * 16 + col]);
            }
            __syncwarp();
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TILE * D; i += THREADS) {
        const int r = i / D, c = i % D;
        if (k0 + r < T) {
            const size_t to = start.qkv + (size_t)(k0 + r) * ld_qkv + c;
            dk[to] = __float2bfloat16(scale * dKs[i]);
            dv[to] = __float2bfloat16(dVs[i]);
        }
    }
}

// dst = src in bf16, `n` values in rows of `width`, which lie `ld` elements apart in dst (dq's
// f32 accumulator into its bf16 place, the first third of each row of the qkv gradient).
extern "C" __global__ void mosaic_f32_to_bf16_rows(const float *__restrict__ src, bf16 *__restrict__ dst,
                                                  unsigned long long n, unsigned long long width,
                                                  unsigned long long ld) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i / width * ld + i % width] = __float2bfloat16(src[i]);
}

// Σ_d dO·O of each of `rows` rows of D values (the backward pass's D_i; a row is a (sample,
// token, head) of the contiguous o and dO), one warp a row.
extern "C" __global__ void mosaic_flash_row_dot(const bf16 *__restrict__ o, const bf16 *__restrict__ dout,
                                                float *__restrict__ dd, int rows, int D) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    float s = 0.f;
    for (int c = lane; c < D; c += 32)
        s += __bfloat162float(o[(size_t)row * D + c]) * __bfloat162float(dout[(size_t)row * D + c]);
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) dd[row] = s;
}

#define FLASH_KERNELS(D)                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        mosaic_flash_forward_##D(const bf16 *q, const bf16 *k, const bf16 *v, const float *bq,       \
                                 const float *bk, const float *bv, int ld_qkv, bf16 *o, int ld_o,    \
                                 float *lse, int T, int heads, int causal, float scale) {            \
        flash_forward<D>(q, k, v, bq, bk, bv, ld_qkv, o, ld_o, lse, T, heads, causal, scale);        \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS) mosaic_flash_backward_##D(                 \
        const bf16 *q, const bf16 *k, const bf16 *v, const float *bq, const float *bk,              \
        const float *bv, int ld_qkv, const bf16 *dout, int ld_o, const float *lse, const float *dd, \
        float *dq, bf16 *dk, bf16 *dv, int T, int heads, int causal, float scale) {                 \
        flash_backward<D>(q, k, v, bq, bk, bv, ld_qkv, dout, ld_o, lse, dd, dq, dk, dv, T, heads,   \
                          causal, scale);                                                            \
    }

FLASH_KERNELS(16)
FLASH_KERNELS(32)
FLASH_KERNELS(48)
FLASH_KERNELS(64)
FLASH_KERNELS(80)
FLASH_KERNELS(96)
FLASH_KERNELS(112)
FLASH_KERNELS(128)
