// A CPU emulation of the CUDA features the engine's kernels use, so that their source runs
// under g++ in tests where no GPU is (`src/emulated.rs`): one std::thread per CUDA thread of
// a block, blocks one after another; __syncthreads and __syncwarp are barriers of the block's
// and the warp's threads; warp shuffles go through a per-warp exchange; bf16 is a 16-bit value
// rounded to nearest even, as __float2bfloat16 does. The tensor-core instructions are in `mma.h`.
// Semantics, not speed: every thread is a real thread, so a missing barrier is a real race here
// too.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace emu {

/// What one emulated CUDA thread knows about where it runs.
struct Place {
    dim3 thread, block, block_dim, grid_dim;
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    std::barrier<> *block_barrier = nullptr;
    std::barrier<> *warp_barrier = nullptr;
    float *warp_exchange = nullptr;  // 32 slots of the thread's warp
    unsigned *warp_words = nullptr;  // 32 × 6 slots of the thread's warp (for mma.h)
    const void **warp_rows = nullptr;  // 32 slots of the thread's warp (for mma.h)
};

inline thread_local Place here;

/// Runs `kernel` on every thread of a `grid` of `block`-sized blocks with `smem_bytes` of
/// dynamic shared memory each; blocks one after another, a block's threads concurrently.
inline void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &kernel) {
    const unsigned threads = block.x * block.y * block.z;
    const unsigned warps = (threads + 31) / 32;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                // Poisoned as a GPU's shared memory is not zeroed: every byte 0xFF, a NaN in
                // f32 and bf16, so a read before a write shows in the results.
                std::vector<unsigned char> smem(smem_bytes + 128, 0xFF);
                unsigned char *aligned = smem.data() + (128 - reinterpret_cast<uintptr_t>(smem.data()) % 128) % 128;
                std::barrier<> block_barrier(threads);
                std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
                for (unsigned w = 0; w < warps; ++w)
                    warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
                std::vector<float> exchange(32 * warps);
                std::vector<unsigned> words(32 * 6 * warps);
                std::vector<const void *> rows(32 * warps);
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        here.thread = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        here.block = {bx, by, bz};
                        here.block_dim = block;
                        here.grid_dim = grid;
                        here.smem = aligned;
                        here.smem_bytes = smem_bytes;
                        here.block_barrier = &block_barrier;
                        here.warp_barrier = warp_barriers[t / 32].get();
                        here.warp_exchange = exchange.data() + 32 * (t / 32);
                        here.warp_words = words.data() + 32 * 6 * (t / 32);
                        here.warp_rows = rows.data() + 32 * (t / 32);
                        kernel();
                    });
                for (auto &th : pool) th.join();
            }
}

}  // namespace emu

#define threadIdx (emu::here.thread)
#define blockIdx (emu::here.block)
#define blockDim (emu::here.block_dim)
#define gridDim (emu::here.grid_dim)
#define DYNAMIC_SMEM(name) unsigned char *name = emu::here.smem

inline void __syncthreads() { emu::here.block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::here.warp_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const unsigned lane = threadIdx.x % 32;
    emu::here.warp_exchange[lane] = v;
    __syncwarp();
    const float other = emu::here.warp_exchange[lane ^ lane_mask];
    __syncwarp();
    return other;
}

inline float atomicAdd(float *at, float v) { return std::atomic_ref<float>(*at).fetch_add(v); }

inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
using std::min;

struct int4 {
    int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

/// bf16: the upper half of an f32.
struct __nv_bfloat16 {
    uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if (std::isnan(f)) return {uint16_t(0x7fc0)};
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return {uint16_t(u >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 b) { return std::bit_cast<float>(uint32_t(b.bits) << 16); }

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
