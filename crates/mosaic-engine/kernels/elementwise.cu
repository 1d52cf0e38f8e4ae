// Elementwise work that candle composes of many kernels or cannot give a backward pass, one
// pass each here:
//
// - LayerNorm, forward and backward, one warp a row. candle-nn's fused forward kernel has no
//   backward pass and is private to its own op; the engine's composed backward pass
//   (`models/nn.rs`, `layer_norm_backward`) takes about twenty passes over an f32 [rows, dim]
//   tensor. Here the backward pass recomputes the mean and 1/σ from x and writes
//   ∂x = r·(gγ − mean(gγ) − x̂·mean(gγ·x̂)) once; ∂γ = Σ g·x̂ and ∂β = Σ g are summed over the
//   block's rows in shared memory and written as one partial row per block, which the caller
//   sums on the device (a [blocks, 2, dim] tensor, small). x and ∂x are f32 (the residual
//   stream); y, and so g, are f32 or bf16: a norm whose output feeds a bf16 product writes it
//   in bf16 and reads its gradient in bf16, where a cast after it and another before its
//   backward pass would each take a pass over the tensor (the values are the same: both round
//   the f32 result once).
// - GELU's backward pass (tanh form, as candle's `gelu`): candle differentiates it with sixteen
//   elementwise ops over the MLP's hidden activations, the step's largest tensor; here
//   ∂x = g·gelu'(x) in one pass, in f32 arithmetic whatever the storage. After a bf16 product
//   with a bias (a block's MLP), the bias and GELU are one pass forward and one backward, the
//   bias's gradient summed on the way.
// - A Linear layer's bias on its bf16 product, and the bias's gradient: candle's broadcast add
//   and the sum over rows behind its backward pass find every element through 64-bit divisions
//   and mod, and that sum reads one column at a time (a 2-byte read per 32-byte sector) and
//   accumulates in bf16; here threads read along rows and sum in f32. Where a residual
//   connection follows the layer, the bias and the add into the f32 stream are one pass.
//
// Compiled to a fatbin by the engine's build script for the GPU build only; `kernels/emulated/`
// runs this source on a CPU for the tests.

#include <cuda_bf16.h>

#ifndef DYNAMIC_SMEM
#define DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// Values of either storage, in f32 arithmetic.
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void put(float &to, float v) { to = v; }
__device__ __forceinline__ void put(__nv_bfloat16 &to, float v) { to = __float2bfloat16(v); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// The mean of a row of `dim` values and 1/√(variance + eps), two passes, by the 32 lanes of a
// warp (lane `lane` reads columns lane, lane + 32, …); every lane gets both.
__device__ __forceinline__ void row_stats(const float *xr, int dim, float eps, int lane, float &mean,
                                          float &r) {
    float s = 0.f;
    for (int c = lane; c < dim; c += 32) s += xr[c];
    mean = warp_sum(s) / dim;
    float v = 0.f;
    for (int c = lane; c < dim; c += 32) {
        const float d = xr[c] - mean;
        v += d * d;
    }
    r = 1.f / sqrtf(warp_sum(v) / dim + eps);
}

// y = (x − mean)/√(var + eps)·γ + β over each row of a contiguous [rows, dim] f32 tensor, one
// warp a row, as candle-nn's layer_norm computes it (its kernel is not public to a custom op);
// y in f32 or bf16 (Y).
template <class Y>
__device__ __forceinline__ void layer_norm(const float *__restrict__ x, const float *__restrict__ gamma,
                                           const float *__restrict__ beta, Y *__restrict__ y, int rows,
                                           int dim, float eps) {
    const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {
        const float *xr = x + (size_t)row * dim;
        float mean, r;
        row_stats(xr, dim, eps, lane, mean, r);
        Y *out = y + (size_t)row * dim;
        for (int c = lane; c < dim; c += 32) put(out[c], (xr[c] - mean) * r * gamma[c] + beta[c]);
    }
}

// The entry point NAME of `layer_norm` writing Y.
#define LAYER_NORM(NAME, Y)                                                                       \
    extern "C" __global__ void NAME(const float *__restrict__ x, const float *__restrict__ gamma,  \
                                    const float *__restrict__ beta, Y *__restrict__ y, int rows,   \
                                    int dim, float eps) {                                          \
        layer_norm(x, gamma, beta, y, rows, dim, eps);                                             \
    }
LAYER_NORM(mosaic_layer_norm_f32, float)
LAYER_NORM(mosaic_layer_norm_f32_to_bf16, __nv_bfloat16)

// x, dx: [rows, dim] f32, contiguous; g: [rows, dim] f32 or bf16 (G), contiguous; gamma: [dim];
// part: [gridDim.x, 2, dim] (∂γ, then ∂β, each block's share). Dynamic shared memory: 2·dim
// floats.
template <class G>
__device__ __forceinline__ void layer_norm_backward(const float *__restrict__ x,
                                                    const float *__restrict__ gamma,
                                                    const G *__restrict__ g, float *__restrict__ dx,
                                                    float *__restrict__ part, int rows, int dim,
                                                    float eps) {
    DYNAMIC_SMEM(smem);
    float *acc = reinterpret_cast<float *>(smem);
    for (int i = threadIdx.x; i < 2 * dim; i += blockDim.x) acc[i] = 0.f;
    __syncthreads();
    const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {
        const float *xr = x + (size_t)row * dim;
        const G *gr = g + (size_t)row * dim;
        float mean, r;
        row_stats(xr, dim, eps, lane, mean, r);
        float a = 0.f, b = 0.f;
        for (int c = lane; c < dim; c += 32) {
            const float gg = to_f32(gr[c]) * gamma[c];
            a += gg;
            b += gg * (xr[c] - mean) * r;
        }
        a = warp_sum(a) / dim;
        b = warp_sum(b) / dim;
        float *out = dx + (size_t)row * dim;
        for (int c = lane; c < dim; c += 32) {
            const float xh = (xr[c] - mean) * r, gc = to_f32(gr[c]);
            out[c] = r * (gc * gamma[c] - a - xh * b);
            atomicAdd(acc + c, gc * xh);
            atomicAdd(acc + dim + c, gc);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * dim; i += blockDim.x) part[(size_t)blockIdx.x * 2 * dim + i] = acc[i];
}

// The entry point NAME of `layer_norm_backward` reading a gradient of G.
#define LAYER_NORM_BACKWARD(NAME, G)                                                              \
    extern "C" __global__ void NAME(const float *__restrict__ x, const float *__restrict__ gamma,  \
                                    const G *__restrict__ g, float *__restrict__ dx,               \
                                    float *__restrict__ part, int rows, int dim, float eps) {      \
        layer_norm_backward(x, gamma, g, dx, part, rows, dim, eps);                                \
    }
LAYER_NORM_BACKWARD(mosaic_layer_norm_backward_f32, float)
LAYER_NORM_BACKWARD(mosaic_layer_norm_backward_bf16_grad, __nv_bfloat16)

// gelu(x) = x/2·(1 + tanh(√(2/π)(x + 0.044715x³))), the tanh form, in f32.
__device__ __forceinline__ float gelu_f32(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// gelu'(x) of the tanh form, gelu(x) = x/2·(1 + tanh(√(2/π)(x + 0.044715x³))).
__device__ __forceinline__ float gelu_grad(float x) {
    const float k = 0.7978845608f;  // √(2/π)
    const float t = tanhf(k * (x + 0.044715f * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * x * x);
}

extern "C" __global__ void mosaic_gelu_backward_f32(const float *__restrict__ x, const float *__restrict__ g,
                                                   float *__restrict__ dx, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dx[i] = g[i] * gelu_grad(x[i]);
}

extern "C" __global__ void mosaic_gelu_backward_bf16(const __nv_bfloat16 *__restrict__ x,
                                                    const __nv_bfloat16 *__restrict__ g,
                                                    __nv_bfloat16 *__restrict__ dx, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dx[i] = __float2bfloat16(__bfloat162float(g[i]) * gelu_grad(__bfloat162float(x[i])));
}

// Each element i of a contiguous [rows, cols] bf16 product y with its column's bias added,
// the add in f32 and rounded to bf16: store(i, y[i] + bias[c]). Threads run along a row (x:
// columns), blocks down the rows (y), so that no index is divided. A warp's load is 64 bytes,
// so the rows are unrolled by 4 to keep four of them in flight per thread: one at a time
// leaves most of the memory's bandwidth unused (Little's law: an H100 needs megabytes in
// flight, its resident threads hold about half a megabyte at one 2-byte load each).
template <class Store>
__device__ __forceinline__ void biased(const __nv_bfloat16 *__restrict__ y, const float *__restrict__ bias,
                                       int rows, int cols, Store store) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float b = bias[c];
#pragma unroll 4
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t i = (size_t)r * cols + c;
        store(i, __float2bfloat16(__bfloat162float(y[i]) + b));
    }
}

// A Linear layer's bias: out = y + bias.
extern "C" __global__ void mosaic_bias_add_bf16(const __nv_bfloat16 *__restrict__ y,
                                               const float *__restrict__ bias,
                                               __nv_bfloat16 *__restrict__ out, int rows, int cols) {
    biased(y, bias, rows, cols, [&](size_t i, __nv_bfloat16 v) { out[i] = v; });
}

// A residual connection after a Linear layer: out = x + (y + bias), into the f32 residual
// stream x, y + bias rounded to bf16 as `mosaic_bias_add_bf16` stores it, so the values are
// those of the bias add, a cast to f32 and an add, which took three passes and kept two more
// tensors on the tape.
extern "C" __global__ void mosaic_residual_bias_add_bf16(const float *__restrict__ x,
                                                        const __nv_bfloat16 *__restrict__ y,
                                                        const float *__restrict__ bias,
                                                        float *__restrict__ out, int rows, int cols) {
    biased(y, bias, rows, cols, [&](size_t i, __nv_bfloat16 v) { out[i] = x[i] + __bfloat162float(v); });
}

// The MLP's first layer: out = gelu(y + bias), y + bias rounded to bf16 (the pre-activation a
// bias add stores), GELU in f32 arithmetic and rounded once. The pre-activation is not stored:
// the backward pass recomputes it from y, so the tape keeps the product and GELU's output only.
extern "C" __global__ void mosaic_bias_gelu_bf16(const __nv_bfloat16 *__restrict__ y,
                                                const float *__restrict__ bias,
                                                __nv_bfloat16 *__restrict__ out, int rows, int cols) {
    biased(y, bias, rows, cols,
           [&](size_t i, __nv_bfloat16 v) { out[i] = __float2bfloat16(gelu_f32(__bfloat162float(v))); });
}

// Its backward pass: dy = g·gelu'(y + bias) (the pre-activation recomputed as the forward pass
// rounded it, the product in f32, dy rounded to bf16), and the bias's gradient in part:
// part[blockIdx.y, c] = Σ dy[r, c] over the rows r ≡ blockIdx.y (mod gridDim.y), in f32; the
// caller sums the gridDim.y partial rows (on the device). The grid of `biased`.
extern "C" __global__ void mosaic_bias_gelu_backward_bf16(const __nv_bfloat16 *__restrict__ y,
                                                         const float *__restrict__ bias,
                                                         const __nv_bfloat16 *__restrict__ g,
                                                         __nv_bfloat16 *__restrict__ dy,
                                                         float *__restrict__ part, int rows, int cols) {
    float s = 0.f;
    biased(y, bias, rows, cols, [&](size_t i, __nv_bfloat16 v) {
        const __nv_bfloat16 d = __float2bfloat16(__bfloat162float(g[i]) * gelu_grad(__bfloat162float(v)));
        dy[i] = d;
        s += __bfloat162float(d);
    });
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) part[(size_t)blockIdx.y * cols + c] = s;
}

// The bias's gradient in part: part[blockIdx.y, c] = Σ g[r, c] over the rows r ≡ blockIdx.y
// (mod gridDim.y), in f32, a warp reading consecutive columns of a row, four rows in flight
// (see `biased`); the caller sums the gridDim.y partial rows (on the device).
extern "C" __global__ void mosaic_column_sums_bf16(const __nv_bfloat16 *__restrict__ g,
                                                  float *__restrict__ part, int rows, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.f;
#pragma unroll 4
    for (int r = blockIdx.y; r < rows; r += gridDim.y) s += __bfloat162float(g[(size_t)r * cols + c]);
    part[(size_t)blockIdx.y * cols + c] = s;
}
