// `cp.async` of `../attention.cu` on the CPU (see cuda_bf16.h here): `cp_async16` queues a
// 16-byte copy from global to this block's shared memory (16 zero bytes where the source is not
// valid), `cp_async_commit` closes the thread's group of queued copies, and
// `cp_async_wait<n>` lands the thread's oldest groups until at most n are pending, as PTX's
// `cp.async.wait_group` waits for them. A copy lands only there, and its destination turns to
// NaN as it is issued: a kernel that reads a tile before waiting for it, or overwrites a tile
// other warps still read (a barrier missing between the last reads of a stage and the next
// copies into it), reads NaN and fails its check, as it could on a GPU, where the copy may land
// at any time in between. A thread that ends with copies pending, a destination that is not 16
// aligned bytes of shared memory, or a source that is not 16-byte aligned, stops the program.
#pragma once

#include "cuda_bf16.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

namespace emu {

struct AsyncCopy {
    void *dst;
    const void *src;  // null: zeros
};

// One thread's queued copies: the open group and the committed ones, oldest first.
struct AsyncCopies {
    std::vector<AsyncCopy> open;
    std::deque<std::vector<AsyncCopy>> groups;
    ~AsyncCopies() {
        if (!open.empty() || !groups.empty()) {
            std::fprintf(stderr, "cp.async: a thread ended with copies it never waited for\n");
            std::abort();
        }
    }
};

inline thread_local AsyncCopies async_copies;

}  // namespace emu

inline void cp_async16(__nv_bfloat16 *dst, const __nv_bfloat16 *src, bool valid) {
    const auto at = reinterpret_cast<uintptr_t>(dst), base = reinterpret_cast<uintptr_t>(emu::here.smem);
    if (at % 16 != 0 || at < base || at + 16 > base + emu::here.smem_bytes) {
        std::fprintf(stderr, "cp.async: %p is not 16 aligned bytes of shared memory\n", static_cast<void *>(dst));
        std::abort();
    }
    if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) {
        std::fprintf(stderr, "cp.async: the source %p is not 16-byte aligned\n", static_cast<const void *>(src));
        std::abort();
    }
    std::memset(dst, 0xFF, 16);  // bf16 NaN until the copy lands
    emu::async_copies.open.push_back({dst, valid ? src : nullptr});
}

inline void cp_async_commit() {
    emu::async_copies.groups.push_back(std::move(emu::async_copies.open));
    emu::async_copies.open.clear();
}

template <int N>
inline void cp_async_wait() {
    auto &groups = emu::async_copies.groups;
    while (groups.size() > N) {
        for (const emu::AsyncCopy &c : groups.front()) {
            if (c.src)
                std::memcpy(c.dst, c.src, 16);
            else
                std::memset(c.dst, 0, 16);
        }
        groups.pop_front();
    }
}
