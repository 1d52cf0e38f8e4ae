// The WMMA API of CUDA's <mma.h> on the CPU (see cuda_bf16.h here): every thread of a warp holds
// the whole 16×16 tile (the real fragments spread it over the lanes in a private layout, which
// the engine's kernels never rely on); loads and products are the same on every lane, a store is
// made by lane 0 alone, so that other lanes see it only after a __syncwarp, as on hardware.
#pragma once

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "only 16x16x16 tiles are emulated");
    float x[16 * 16];
};

template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v) {
    std::fill(std::begin(f.x), std::end(f.x), v);
}

template <class Use>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, row_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = __bfloat162float(p[r * ldm + c]);
}

template <class Use>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, col_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = __bfloat162float(p[c * ldm + r]);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                             layout_t layout) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout) {
    if (threadIdx.x % 32 != 0) return;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    float out[16 * 16];
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            float s = c.x[i * 16 + j];
            for (int k = 0; k < 16; ++k) s += a.x[i * 16 + k] * b.x[k * 16 + j];
            out[i * 16 + j] = s;
        }
    std::copy(std::begin(out), std::end(out), d.x);
}

}  // namespace wmma
}  // namespace nvcuda
