// Fused attention, forward and backward: FlashAttention-2 (Dao, ICLR 2024, Algorithms 1 and 2)
// on bf16 tensor cores through `mma.sync` m16n8k16 (bf16 in, f32 accumulate). The `tokens²`
// scores never reach device memory: each block streams tiles of keys and values through shared
// memory, keeps a running maximum and sum per query row (online softmax), and the backward pass
// recomputes the probabilities from the forward's log-sum-exp. This replaces the engine's
// composed attention on a GPU (two batched GEMMs around a materialised softmax, and its
// backward's five more passes over the scores).
//
// As FlashAttention-2 does, every product's accumulator stays in registers: scores,
// probabilities, the output and dK, dV are fragments of m16n8k16 products, and the
// probabilities go from a product's accumulator straight into the next product's A operand
// (the layouts coincide, two 8-column tiles making one 16-column operand). Shared memory holds
// only the tiles of q, k, v and dO (and the backward pass's dSᵀ, which dQ needs across warps),
// each row padded by 8 elements so that the lanes of a warp read 32 distinct banks. The first
// version (2026-11-27) kept scores and accumulators in shared memory around WMMA products: on an
// H200 (2026-11-28) its forward pass at CLIP's vision shape spent 91 % of its time on shared
// memory and ran at 14 TFLOP/s, 19× slower than PyTorch's scaled_dot_product_attention.
//
// Layout: q, k and v are read where the qkv projection wrote them, bf16 `[batch, tokens, 3,
// heads, D]`, its bias (f32, bq, bk and bv of `[3, heads, D]`) applied by the kernels (below),
// and o is written where the output projection reads it, `[batch, tokens, heads, D]`, so no
// copy rearranges them around the kernels (as FlashAttention's own interface takes strided q,
// k, v) and no pass adds the bias. Every matrix is thus rows of D values, one a token, `ld`
// elements apart (3·heads·D for q, k, v and their gradients, heads·D for o, dO and dq's
// accumulator), head h of a row h·D from its start: the kernels take pointers to head 0 of
// token 0 of sample 0. The scores are `scale · q·kᵀ`; lse and the row dots are f32 `[batch,
// tokens, heads]`, the row order of o; dq accumulates in f32 (zeroed by the host) through
// atomics, as FlashAttention-2 does, and is cast to bf16 into its place by
// `mosaic_f32_to_bf16_rows`. D (the head dimension) is a multiple of 16 up to 128, one kernel
// each, so every row of a head starts on a 32-byte boundary of a 32-byte-aligned allocation, as
// the 16-byte tile loads need.
//
// The bias, where it counts. q's is added as q's tiles load. k's changes no probability: it adds
// scale · q·bk to every score of a query row, which softmax takes out, so the kernels leave it
// out, and lse is that of the scores without it (the backward pass recomputes the same
// probabilities from it; dQ = dS·K loses the term (Σ_j dS_ij)·bk, 0 since dS's rows sum to 0).
// v's adds bv to every output row (the probabilities sum to 1), so the forward pass adds it to o
// once instead of to every value it loads; the backward pass loads its v tile once a block, with
// the bias, so that dP = dO·vᵀ matches the row dots Σ dO·O. The forward pass's key and value
// tiles, which every query tile loads again, are thus plain copies.
//
// Compiled to a fatbin by the engine's build script, for the GPU build only.

#include <cuda_bf16.h>

// The block's dynamic shared memory (a CPU emulation of this file, `kernels/emulated/`, defines
// its own).
#ifndef DYNAMIC_SMEM
#define DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

typedef __nv_bfloat16 bf16;

#ifdef __CUDACC__
// c += a · b for a 16×16 bf16 A, a 16×8 bf16 B and a 16×8 f32 C spread over the lanes of a warp,
// in PTX's m16n8k16 fragment layout (lane = 4g + t): a[0] holds A's row g, columns 2t and
// 2t+1 (the lower half the first), a[1] row g+8, a[2] row g, columns 2t+8 and 2t+9, a[3] row
// g+8 there; b[0] B's rows 2t and 2t+1 of column g, b[1] rows 2t+8 and 2t+9; c[0], c[1] C's row
// g, columns 2t and 2t+1, c[2], c[3] row g+8.
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8×8 bf16 matrices from shared memory into r[0…3], each in an m16n8k16 fragment's layout:
// lanes 8i … 8i+7 point at the eight rows of matrix i (16 contiguous bytes each, 16-byte
// aligned), and lane 4g + t receives in r[i] its row g, columns 2t and 2t+1 (`ldmatrix`), or
// with `trans` its rows 2t and 2t+1 of column g (`ldmatrix.trans`).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16 *row) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16 *row) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

// 16 bytes from global to shared memory without passing through registers (`cp.async.cg`,
// cached in L2 only), or 16 zero bytes where `valid` is false (nothing is read then); they land
// once a `cp_async_wait<n>` that leaves at most n newer groups pending has returned, for this
// thread (a barrier then shows them to the block).
__device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool valid) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(valid ? 16 : 0));
}

// Closes this thread's group of `cp_async16` copies issued since the last.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's newest groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#else
#include <async_copy.h>  // the CPU emulation's cp.async (kernels/emulated/async_copy.h)
#include <mma.h>         // and its mma_16816 and ldmatrix (kernels/emulated/mma.h)
#endif

#define WARPS 4
#define THREADS (WARPS * 32)
// Query rows per forward block (16 per warp) and per backward tile; keys per forward tile and
// per backward block (16 per warp). Equal, so a causal block's tiles end at its own index.
#define TILE 64
// Elements a row of a shared-memory tile is padded by: rows 16 bytes further apart than their
// data, so the eight rows an `ldmatrix` phase reads fall in distinct banks.
#define PAD 8
#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF (__int_as_float(0x7f800000))

// Two bf16 values in one 32-bit register, `lo` in the lower half (a fragment's element order).
__device__ __forceinline__ unsigned pack(bf16 lo, bf16 hi) {
    return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
    return pack(__float2bfloat16(lo), __float2bfloat16(hi));
}

// Where lane i = 4g + t of a warp sits in the m16n8k16 fragments (see mma_16816).
struct Lane {
    int i, g, t;
};

// The row lane l points `ldmatrix` at to load the four 8×8 quarters of the 16×16 tile at m
// (rows `ld` elements apart) in the order top left, bottom left, top right, bottom right.
__device__ __forceinline__ const bf16 *down_first(const bf16 *m, int ld, Lane l) {
    return m + (l.i % 8 + 8 * (l.i / 8 % 2)) * ld + 8 * (l.i / 16);
}

// … in the order top left, top right, bottom left, bottom right.
__device__ __forceinline__ const bf16 *across_first(const bf16 *m, int ld, Lane l) {
    return m + (l.i % 8 + 8 * (l.i / 16)) * ld + 8 * (l.i / 8 % 2);
}

// The A operand whose element (r, k) is m[r·ld + k]: 16 rows of a row-major tile.
__device__ __forceinline__ void a_rows(unsigned (&a)[4], const bf16 *m, int ld, Lane l) {
    ldmatrix_x4(a, down_first(m, ld, l));
}

// The A operand whose element (r, k) is m[k·ld + r]: a row-major tile read transposed.
__device__ __forceinline__ void a_cols(unsigned (&a)[4], const bf16 *m, int ld, Lane l) {
    ldmatrix_x4_trans(a, across_first(m, ld, l));
}

// The B operands b[j] whose element (k, n) is m[(8j + n)·ld + k]: two 8-row blocks of a
// row-major tile, as Kᵀ is to K.
__device__ __forceinline__ void b_rows(unsigned (&b)[2][2], const bf16 *m, int ld, Lane l) {
    unsigned r[4];
    ldmatrix_x4(r, across_first(m, ld, l));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The B operands b[j] whose element (k, n) is m[k·ld + 8j + n]: 16 rows and two 8-column
// blocks of a row-major tile.
__device__ __forceinline__ void b_cols(unsigned (&b)[2][2], const bf16 *m, int ld, Lane l) {
    unsigned r[4];
    ldmatrix_x4_trans(r, down_first(m, ld, l));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The A operand of columns 16c … 16c+15 of a 16 × (8·N) accumulator (rows of probabilities or
// dS): its 8-column tiles 2c and 2c+1, rounded to bf16.
template <int N>
__device__ __forceinline__ void a_of(unsigned (&a)[4], const float (&acc)[N][4], int c) {
    a[0] = pack(acc[2 * c][0], acc[2 * c][1]);
    a[1] = pack(acc[2 * c][2], acc[2 * c][3]);
    a[2] = pack(acc[2 * c + 1][0], acc[2 * c + 1][1]);
    a[3] = pack(acc[2 * c + 1][2], acc[2 * c + 1][3]);
}

// c[n] += a · b[0] and c[n + 1] += a · b[1]: one A operand against the two B operands of
// b_rows or b_cols.
template <int N>
__device__ __forceinline__ void mma_pair(float (&c)[N][4], int n, const unsigned (&a)[4],
                                         const unsigned (&b)[2][2]) {
    mma_16816(c[n], a, b[0]);
    mma_16816(c[n + 1], a, b[1]);
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// The maximum and the sum of a value over the 4 lanes of a quad (the lanes holding one row of
// an accumulator), on each of them.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Copies rows row0 … row0+TILE of a [T, D] bf16 matrix whose rows lie `ld` elements apart
// into a [TILE, D + PAD] tile, 16 bytes a load, with `bias` (D f32 values, where given) added to
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
        *reinterpret_cast<int4 *>(dst + r * (D + PAD) + c) = v;
    }
}

// The same tile as plain copies (no bias), issued with `cp_async16` into one group for the caller
// to commit and wait for: rows past T become zeros.
template <int D>
__device__ __forceinline__ void load_tile_async(bf16 *dst, const bf16 *src, int ld, int row0, int T) {
    const int per_row = D / 8;
    for (int i = threadIdx.x; i < TILE * per_row; i += THREADS) {
        const int r = i / per_row, c = (i % per_row) * 8;
        const bool in = row0 + r < T;
        // A row past T reads nothing; its address stays inside the tile's first row.
        cp_async16(dst + r * (D + PAD) + c, src + (size_t)(in ? row0 + r : row0) * ld + c, in);
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

// Bytes of dynamic shared memory the forward kernel of head dimension D takes: a Q tile and two
// stages of K and V tiles.
#define FWD_SMEM(D) (5 * TILE * ((D) + PAD) * 2)

// One block: TILE query rows of one (sample, head), warp w owning rows 16w … 16w+15 (lane
// 4g + t holds rows g and g+8 of them). Q's fragments stay in registers; each key tile's
// scores S = QKᵀ, probabilities and the output O += PV are accumulators; a row's running
// maximum is shared by its quad, its running sum summed over the quad once, at the end. Key
// and value tiles come in two stages: the next tile's copies are in flight (`cp.async`) while
// the warps work on this one, as FlashAttention-2 overlaps them.
template <int D>
__device__ __forceinline__ void flash_forward(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                              const bf16 *__restrict__ v, const float *__restrict__ bq,
                                              const float *__restrict__ bk, const float *__restrict__ bv,
                                              int ld_qkv, bf16 *__restrict__ o, int ld_o,
                                              float *__restrict__ lse, int T, int heads, int causal,
                                              float scale) {
    constexpr int LD = D + PAD;
    DYNAMIC_SMEM(smem);
    bf16 *Qs = reinterpret_cast<bf16 *>(smem);  // [TILE, LD]
    bf16 *KV = Qs + TILE * LD;                  // stage s: K at [2s], V at [2s + 1], [TILE, LD] each

    const int q0 = blockIdx.x * TILE;
    const Head start = head_of(T, heads, D, ld_qkv, ld_o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Lane l{lane, lane / 4, lane % 4};
    const int rows[2] = {q0 + warp * 16 + l.g, q0 + warp * 16 + l.g + 8};

    int tiles = (T + TILE - 1) / TILE;
    if (causal) tiles = min(tiles, (int)blockIdx.x + 1);
    // Key tile j's K and V, into stage j mod 2, as one group of copies.
    auto issue = [&](int j) {
        bf16 *Ks = KV + (j % 2) * 2 * TILE * LD;
        load_tile_async<D>(Ks, k + start.qkv, ld_qkv, j * TILE, T);
        load_tile_async<D>(Ks + TILE * LD, v + start.qkv, ld_qkv, j * TILE, T);
        cp_async_commit();
    };
    issue(0);
    load_tile<D>(Qs, q + start.qkv, ld_qkv, q0, T, bq + start.bias);
    __syncthreads();
    unsigned qa[D / 16][4];
#pragma unroll
    for (int c = 0; c < D / 16; ++c) a_rows(qa[c], Qs + warp * 16 * LD + c * 16, LD, l);

    float acc[D / 8][4];
    zero(acc);
    float m[2] = {NEG_INF, NEG_INF}, sum[2] = {0.f, 0.f};  // sum: this lane's share of the row

    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * TILE;
        // The next tile into the other stage, which every warp was done with at the end of
        // the last iteration; then this one's copies, landed.
        if (j + 1 < tiles) {
            issue(j + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // every thread's copies of tile j have landed
        const bf16 *Ks = KV + (j % 2) * 2 * TILE * LD, *Vs = Ks + TILE * LD;

        float s[TILE / 8][4];
        zero(s);
#pragma unroll
        for (int n = 0; n < TILE / 8; n += 2)
#pragma unroll
            for (int c = 0; c < D / 16; ++c) {
                unsigned b[2][2];
                b_rows(b, Ks + n * 8 * LD + c * 16, LD, l);
                mma_pair(s, n, qa[c], b);
            }

        // Online softmax: mask (on a tile that reaches past the tokens or, causal, past a query
        // row of the block) and scale, each row's new maximum over its quad, the probabilities,
        // and what came before rescaled.
        float mx[2] = {NEG_INF, NEG_INF};
        const bool edge = k0 + TILE > T || (causal && k0 + TILE - 1 > q0);
#pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + n * 8 + 2 * l.t + (e & 1), row = rows[e / 2];
                const bool masked = edge && (key >= T || (causal && key > row));
                const float x = masked ? NEG_INF : scale * s[n][e];
                s[n][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        float use[2], alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float m_new = fmaxf(m[h], quad_max(mx[h]));
            // -inf only while every key seen so far is masked: then every weight is 0.
            use[h] = m_new == NEG_INF ? 0.f : m_new;
            alpha[h] = __expf(m[h] - use[h]);
            m[h] = m_new;
            sum[h] *= alpha[h];
        }
#pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = __expf(s[n][e] - use[e / 2]);
                s[n][e] = p;
                sum[e / 2] += p;
            }
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] *= alpha[e / 2];

        // O += P V.
#pragma unroll
        for (int c = 0; c < TILE / 16; ++c) {
            unsigned pa[4];
            a_of(pa, s, c);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                unsigned b[2][2];
                b_cols(b, Vs + c * 16 * LD + n * 8, LD, l);
                mma_pair(acc, n, pa, b);
            }
        }
        __syncthreads();  // every warp is done with stage j mod 2 before tile j + 2 goes there
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float total = quad_sum(sum[h]);
        if (rows[h] >= T) continue;
        const float inv = 1.f / total;
        bf16 *out = o + start.o + (size_t)rows[h] * ld_o + 2 * l.t;
        const float *b = bv + start.bias + 2 * l.t;  // v's bias, once (see the top)
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<unsigned *>(out + n * 8) =
                pack(acc[n][2 * h] * inv + b[n * 8], acc[n][2 * h + 1] * inv + b[n * 8 + 1]);
        if (l.t == 0) lse[start.row + (size_t)rows[h] * heads] = m[h] + __logf(total);
    }
}

// Bytes of dynamic shared memory the backward kernel of head dimension D takes: K, V, Q and dO
// tiles, dSᵀ, and a query tile's lse and row dots.
#define BWD_SMEM(D) (4 * TILE * ((D) + PAD) * 2 + TILE * (TILE + PAD) * 2 + 2 * TILE * 4)

// One block: TILE keys of one (sample, head), warp w owning keys 16w … 16w+15 (lane 4g + t
// holds keys g and g+8 of them); it walks the query tiles that can see them. Per tile, each
// warp computes its keys' Sᵀ = KQᵀ, Pᵀ, dV += PᵀdO, dPᵀ = VdOᵀ, dSᵀ and dK += dSᵀQ in
// registers; dSᵀ goes to shared memory, where warp w reads queries 16w … 16w+15 of it for dQ
// += dS K over the block's keys, added to device memory atomically. `dd` holds each query
// row's Σ dO·O.
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
    constexpr int LD = D + PAD, LDS = TILE + PAD;
    DYNAMIC_SMEM(smem);
    bf16 *Ks = reinterpret_cast<bf16 *>(smem);  // [TILE keys, LD]
    bf16 *Vs = Ks + TILE * LD;                  // [TILE keys, LD]
    bf16 *Qs = Vs + TILE * LD;                  // [TILE queries, LD]
    bf16 *dOs = Qs + TILE * LD;                 // [TILE queries, LD]
    bf16 *dSs = dOs + TILE * LD;                // dSᵀ [TILE keys, LDS]
    float *lse_s = reinterpret_cast<float *>(dSs + TILE * LDS);  // [TILE queries]
    float *dd_s = lse_s + TILE;                                  // [TILE queries]

    const int k0 = blockIdx.x * TILE;
    const Head start = head_of(T, heads, D, ld_qkv, ld_o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Lane l{lane, lane / 4, lane % 4};
    const int keys[2] = {k0 + warp * 16 + l.g, k0 + warp * 16 + l.g + 8};
    const bf16 *Kw = Ks + warp * 16 * LD, *Vw = Vs + warp * 16 * LD;

    // k without its bias, as the forward pass's lse was made (see the top).
    load_tile<D>(Ks, k + start.qkv, ld_qkv, k0, T);
    load_tile<D>(Vs, v + start.qkv, ld_qkv, k0, T, bv + start.bias);
    float dK[D / 8][4], dV[D / 8][4];
    zero(dK);
    zero(dV);
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

        // Sᵀ = K Qᵀ (unscaled) and dPᵀ = V dOᵀ for the warp's 16 keys.
        float s[TILE / 8][4], dp[TILE / 8][4];
        zero(s);
        zero(dp);
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
            unsigned ka[4], va[4];
            a_rows(ka, Kw + c * 16, LD, l);
            a_rows(va, Vw + c * 16, LD, l);
#pragma unroll
            for (int n = 0; n < TILE / 8; n += 2) {
                unsigned b[2][2];
                b_rows(b, Qs + n * 8 * LD + c * 16, LD, l);
                mma_pair(s, n, ka, b);
                b_rows(b, dOs + n * 8 * LD + c * 16, LD, l);
                mma_pair(dp, n, va, b);
            }
        }

        // Pᵀ = exp(scale·Sᵀ − lse), 0 where masked; then dSᵀ = Pᵀ ⊙ (dPᵀ − Σ dO·O) in dp.
#pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qq = n * 8 + 2 * l.t + (e & 1), qi = q0 + qq, key = keys[e / 2];
                const bool masked = key >= T || qi >= T || (causal && key > qi);
                const float p = masked ? 0.f : __expf(scale * s[n][e] - lse_s[qq]);
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - dd_s[qq]);
            }

        // dV += Pᵀ dO and dK += dSᵀ Q (scaled once, when written).
#pragma unroll
        for (int c = 0; c < TILE / 16; ++c) {
            unsigned pa[4], da[4];
            a_of(pa, s, c);
            a_of(da, dp, c);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                unsigned b[2][2];
                b_cols(b, dOs + c * 16 * LD + n * 8, LD, l);
                mma_pair(dV, n, pa, b);
                b_cols(b, Qs + c * 16 * LD + n * 8, LD, l);
                mma_pair(dK, n, da, b);
            }
        }

        // dSᵀ to shared memory, rounded to bf16 as the products above read it.
#pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<unsigned *>(dSs + (warp * 16 + l.g + 8 * h) * LDS + n * 8 + 2 * l.t) =
                    pack(dp[n][2 * h], dp[n][2 * h + 1]);
        __syncthreads();  // every warp's dSᵀ is written

        // dQ += scale · dS K for queries 16w … 16w+15 of the tile over the block's keys: dS is
        // dSᵀ read transposed.
        unsigned dsa[TILE / 16][4];
#pragma unroll
        for (int c = 0; c < TILE / 16; ++c) a_cols(dsa[c], dSs + c * 16 * LDS + warp * 16, LDS, l);
        const int qrows[2] = {q0 + warp * 16 + l.g, q0 + warp * 16 + l.g + 8};
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            float d[2][4] = {};
#pragma unroll
            for (int c = 0; c < TILE / 16; ++c) {
                unsigned b[2][2];
                b_cols(b, Ks + c * 16 * LD + n * 8, LD, l);
                mma_pair(d, 0, dsa[c], b);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (qrows[h] < T)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float *to = dq + start.o + (size_t)qrows[h] * ld_o + (n + j) * 8 + 2 * l.t;
                        atomicAdd(to, scale * d[j][2 * h]);
                        atomicAdd(to + 1, scale * d[j][2 * h + 1]);
                    }
        }
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (keys[h] >= T) continue;
        const size_t at = start.qkv + (size_t)keys[h] * ld_qkv + 2 * l.t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            *reinterpret_cast<unsigned *>(dk + at + n * 8) = pack(scale * dK[n][2 * h], scale * dK[n][2 * h + 1]);
            *reinterpret_cast<unsigned *>(dv + at + n * 8) = pack(dV[n][2 * h], dV[n][2 * h + 1]);
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

// Each head dimension's kernels; `BWD_BOUNDS` the backward kernel's launch bounds. Held to three
// blocks an SM at head dimension 64 (and 16 and 32), its 168 registers a thread let three blocks
// share an SM where two did at 172 (ptxas: a 4-byte spill at 64, none below), for a kernel that
// ran at 12 % occupancy, latency-bound, on an H200 (2026-11-28; not yet run so bounded). At 48
// the bound spills 20 bytes, from 80 up far more: those are left to the compiler.
#define BWD_3_BLOCKS __launch_bounds__(THREADS, 3)
#define BWD_FREE __launch_bounds__(THREADS)

#define FLASH_KERNELS(D, BWD_BOUNDS)                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        mosaic_flash_forward_##D(const bf16 *q, const bf16 *k, const bf16 *v, const float *bq,       \
                                 const float *bk, const float *bv, int ld_qkv, bf16 *o, int ld_o,    \
                                 float *lse, int T, int heads, int causal, float scale) {            \
        flash_forward<D>(q, k, v, bq, bk, bv, ld_qkv, o, ld_o, lse, T, heads, causal, scale);        \
    }                                                                                                \
    extern "C" __global__ void BWD_BOUNDS mosaic_flash_backward_##D(                                 \
        const bf16 *q, const bf16 *k, const bf16 *v, const float *bq, const float *bk,              \
        const float *bv, int ld_qkv, const bf16 *dout, int ld_o, const float *lse, const float *dd, \
        float *dq, bf16 *dk, bf16 *dv, int T, int heads, int causal, float scale) {                 \
        flash_backward<D>(q, k, v, bq, bk, bv, ld_qkv, dout, ld_o, lse, dd, dq, dk, dv, T, heads,   \
                          causal, scale);                                                            \
    }

FLASH_KERNELS(16, BWD_3_BLOCKS)
FLASH_KERNELS(32, BWD_3_BLOCKS)
FLASH_KERNELS(48, BWD_FREE)
FLASH_KERNELS(64, BWD_3_BLOCKS)
FLASH_KERNELS(80, BWD_FREE)
FLASH_KERNELS(96, BWD_FREE)
FLASH_KERNELS(112, BWD_FREE)
FLASH_KERNELS(128, BWD_FREE)
