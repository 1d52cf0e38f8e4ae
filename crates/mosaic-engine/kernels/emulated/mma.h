// The warp-wide tensor-core product of `../attention.cu` on the CPU (see cuda_bf16.h here):
// `mma_16816`, PTX's `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`. Each lane posts its
// fragments to its warp's exchange, every lane reads the whole of A and B back from the
// fragment layout PTX documents (lane = 4g + t; see mma_16816 in attention.cu) and computes its
// own four elements of C, so a kernel that hands the product a wrong layout gets wrong numbers
// here as on a GPU.
#pragma once

#include "cuda_bf16.h"

// c += a · b: A 16×16 and B 16×8 in bf16, C 16×8 in f32, each lane holding its fragments.
inline void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const unsigned lane = threadIdx.x % 32;
    unsigned *words = emu::here.warp_words;
    for (int i = 0; i < 4; ++i) words[lane * 8 + i] = a[i];
    words[lane * 8 + 4] = b[0];
    words[lane * 8 + 5] = b[1];
    __syncwarp();
    // The bf16 in half `odd` of register `reg` of lane `owner`.
    auto at = [&](unsigned owner, unsigned reg, unsigned odd) {
        const unsigned w = words[owner * 8 + reg];
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
