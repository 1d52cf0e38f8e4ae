// The warp-wide tensor-core instructions of `../attention.cu` on the CPU (see cuda_bf16.h here):
// `mma_16816`, PTX's `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, and `ldmatrix_x4`
// (with `_trans`), PTX's `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`. Each lane posts
// its fragments (or its row's address) to its warp's exchange, and every lane reads back what
// the layouts PTX documents give it (lane = 4g + t; see attention.cu), so a kernel that hands
// them a wrong layout gets wrong numbers here as on a GPU; a row that is not 16 bytes of this
// block's shared memory on a 16-byte boundary stops the program, as it would fault there.
#pragma once

#include "cuda_bf16.h"

#include <cstdio>
#include <cstdlib>

// c += a · b: A 16×16 and B 16×8 in bf16, C 16×8 in f32, each lane holding its fragments.
inline void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const unsigned lane = threadIdx.x % 32;
    unsigned *words = emu::here.warp_words;
    for (int i = 0; i < 4; ++i) words[lane * 6 + i] = a[i];
    words[lane * 6 + 4] = b[0];
    words[lane * 6 + 5] = b[1];
    __syncwarp();
    // The bf16 in half `odd` of register `reg` of lane `owner`.
    auto at = [&](unsigned owner, unsigned reg, unsigned odd) {
        const unsigned w = words[owner * 6 + reg];
        return __bfloat162float(__nv_bfloat16{uint16_t(odd ? w >> 16 : w & 0xffffu)});
    };
    // A(r, k): lane 4·(r mod 8) + (k mod 8)/2, register (r ≥ 8) + 2·(k ≥ 8), half k mod 2.
    auto A = [&](int r, int k) { return at(4 * (r % 8) + (k % 8) / 2, r / 8 + 2 * (k / 8), k % 2); };
    // B(k, n): lane 4n + (k mod 8)/2, register 4 + (k ≥ 8), half k mod 2.
    auto B = [&](int k, int n) { return at(4 * n + (k % 8) / 2, 4 + k / 8, k % 2); };
    const int g = lane / 4, t = lane % 4;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
        float s = c[e];
        for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
        out[e] = s;
    }
    __syncwarp();  // every lane has read the fragments before any posts its next ones
    for (int e = 0; e < 4; ++e) c[e] = out[e];
}

namespace emu {

// ldmatrix .x4, transposed or not: lane 4g + t gets, of the matrix whose rows lanes 8i … 8i+7
// point at, row g's columns 2t and 2t+1 (or rows 2t and 2t+1 of column g) in r[i].
inline void ldmatrix(unsigned (&r)[4], const __nv_bfloat16 *row, bool trans) {
    const unsigned lane = threadIdx.x % 32;
    const auto at = reinterpret_cast<uintptr_t>(row), base = reinterpret_cast<uintptr_t>(here.smem);
    if (at % 16 != 0 || at < base || at + 16 > base + here.smem_bytes) {
        std::fprintf(stderr, "ldmatrix: lane %u's row %p is not 16 aligned bytes of shared memory\n", lane,
                     static_cast<const void *>(row));
        std::abort();
    }
    here.warp_rows[lane] = row;
    __syncwarp();
    const int g = lane / 4, t = lane % 4;
    auto element = [&](int matrix, int i, int j) {  // row i, column j
        return static_cast<const __nv_bfloat16 *>(here.warp_rows[8 * matrix + i])[j];
    };
    for (int m = 0; m < 4; ++m) {
        const __nv_bfloat16 lo = trans ? element(m, 2 * t, g) : element(m, g, 2 * t);
        const __nv_bfloat16 hi = trans ? element(m, 2 * t + 1, g) : element(m, g, 2 * t + 1);
        r[m] = unsigned(lo.bits) | unsigned(hi.bits) << 16;
    }
    __syncwarp();  // every lane has read the rows before any posts its next one
}

}  // namespace emu

inline void ldmatrix_x4(unsigned (&r)[4], const __nv_bfloat16 *row) { emu::ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const __nv_bfloat16 *row) { emu::ldmatrix(r, row, true); }
