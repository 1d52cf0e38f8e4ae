// Runs the fused attention kernels of `../attention.cu` on the CPU (this folder's emulation of
// CUDA and WMMA) against attention computed directly in f64 from the same bf16 inputs: the
// output, the log-sum-exp and the gradients of q, k and v, for head dimensions 16 to 128,
// token counts below, at and past a tile (64), causal or not. Prints one line a case and exits
// 1 if any misses its bound. Built and run by `tests/kernels.rs`.
#include "../attention.cu"
#include "check.h"

#include <cstdio>
#include <random>

namespace {

using bf16 = __nv_bfloat16;

struct Errors {
    double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

template <class F>
void launch(unsigned gx, unsigned gy, unsigned threads, size_t smem, F kernel) {
    emu::launch({gx, gy, 1}, {threads, 1, 1}, smem, kernel);
}

Errors run(int bh, int T, int D, bool causal, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    const size_t n = size_t(bh) * T * D;
    auto draw = [&](float scale) {
        std::vector<bf16> v(n);
        for (auto &x : v) x = __float2bfloat16(normal(rng) * scale);
        return v;
    };
    const auto q = draw(1.f), k = draw(1.f), v = draw(1.f), dout = draw(1.f);
    const float scale = 1.f / std::sqrt(float(D));
    auto f = [](bf16 x) { return double(__bfloat162float(x)); };

    // Reference, in f64.
    std::vector<double> o_ref(n), lse_ref(size_t(bh) * T), dq_ref(n), dk_ref(n), dv_ref(n);
    for (int b = 0; b < bh; ++b) {
        const size_t base = size_t(b) * T * D;
        std::vector<double> p(size_t(T) * T), dp(size_t(T) * T);
        for (int i = 0; i < T; ++i) {
            double mx = -1e300;
            for (int j = 0; j < T; ++j) {
                double s = 0;
                for (int d = 0; d < D; ++d) s += f(q[base + i * D + d]) * f(k[base + j * D + d]);
                p[i * T + j] = (causal && j > i) ? -1e300 : scale * s;
                mx = std::max(mx, p[i * T + j]);
            }
            double sum = 0;
            for (int j = 0; j < T; ++j) sum += (p[i * T + j] = (causal && j > i) ? 0 : std::exp(p[i * T + j] - mx));
            for (int j = 0; j < T; ++j) p[i * T + j] /= sum;
            lse_ref[size_t(b) * T + i] = mx + std::log(sum);
            for (int d = 0; d < D; ++d) {
                double o = 0;
                for (int j = 0; j < T; ++j) o += p[i * T + j] * f(v[base + j * D + d]);
                o_ref[base + i * D + d] = o;
            }
            double row = 0;
            for (int j = 0; j < T; ++j) {
                double s = 0;
                for (int d = 0; d < D; ++d) s += f(dout[base + i * D + d]) * f(v[base + j * D + d]);
                dp[i * T + j] = s;
                row += s * p[i * T + j];
            }
            for (int j = 0; j < T; ++j) dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - row);  // dS
        }
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j)
                for (int d = 0; d < D; ++d) {
                    dq_ref[base + i * D + d] += scale * dp[i * T + j] * f(k[base + j * D + d]);
                    dk_ref[base + j * D + d] += scale * dp[i * T + j] * f(q[base + i * D + d]);
                    dv_ref[base + j * D + d] += p[i * T + j] * f(dout[base + i * D + d]);
                }
    }

    // The kernels.
    std::vector<bf16> o(n), dq(n), dk(n), dv(n);
    std::vector<float> lse(size_t(bh) * T), dd(size_t(bh) * T), dq32(n, 0.f);
    const unsigned tiles = (T + TILE - 1) / TILE;
    const int c = causal;
    size_t fwd = FWD_SMEM(D), bwd = BWD_SMEM(D);
    auto forward = [&] {
        switch (D) {
#define CASE(d) case d: mosaic_flash_forward_##d(q.data(), k.data(), v.data(), o.data(), lse.data(), T, c, scale); break;
            CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128)
#undef CASE
        }
    };
    auto backward = [&] {
        switch (D) {
#define CASE(d) case d: mosaic_flash_backward_##d(q.data(), k.data(), v.data(), dout.data(), lse.data(), dd.data(), dq32.data(), dk.data(), dv.data(), T, c, scale); break;
            CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128)
#undef CASE
        }
    };
    launch(tiles, bh, THREADS, fwd, forward);
    const int rows = bh * T;
    launch((rows + 3) / 4, 1, 128, 0, [&] { mosaic_flash_row_dot(o.data(), dout.data(), dd.data(), rows, D); });
    launch(tiles, bh, THREADS, bwd, backward);
    const unsigned long long count = n;
    launch(2, 1, 256, 0, [&] { mosaic_f32_to_bf16(dq32.data(), dq.data(), count); });

    auto floats = [](const std::vector<bf16> &x) {
        std::vector<float> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
        return out;
    };
    Errors e;
    e.o = relative(floats(o), o_ref, 1e-2);
    e.lse = relative(lse, lse_ref, 1e-2);
    e.dq = relative(floats(dq), dq_ref, 1e-2);
    e.dk = relative(floats(dk), dk_ref, 1e-2);
    e.dv = relative(floats(dv), dv_ref, 1e-2);
    return e;
}

}  // namespace

int main() {
    struct Case {
        int bh, T, D;
        bool causal;
    };
    const Case cases[] = {
        {2, 1, 64, false},  {2, 37, 64, true},   {2, 64, 16, false}, {1, 130, 64, true},
        {1, 130, 48, false}, {1, 77, 80, true},  {1, 70, 128, false}, {1, 65, 32, true},
        {1, 20, 96, false},  {1, 20, 112, true}, {3, 200, 64, true},
    };
    // bf16 probabilities and dS (as FlashAttention keeps them) bound the agreement.
    const double bound = 2e-2;
    bool ok = true;
    unsigned seed = 1;
    for (const Case &c : cases) {
        const Errors e = run(c.bh, c.T, c.D, c.causal, seed++);
        const double worst = std::max({e.o, e.lse, e.dq, e.dk, e.dv});
        const bool pass = worst < bound && std::isfinite(worst);
        ok = ok && pass;
        std::printf("%s bh=%d T=%d D=%d causal=%d: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
                    pass ? "pass" : "FAIL", c.bh, c.T, c.D, int(c.causal), e.o, e.lse, e.dq, e.dk, e.dv);
    }
    return ok ? 0 : 1;
}
