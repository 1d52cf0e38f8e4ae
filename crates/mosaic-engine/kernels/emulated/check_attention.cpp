// Runs the fused attention kernels of `../attention.cu` on the CPU (this folder's emulation of
// CUDA and its tensor-core instructions) against attention computed directly in f64 from the
// same bf16 inputs: the output, the log-sum-exp and the gradients of q, k and v, in the layouts
// the engine hands the kernels (q, k, v as the qkv projection writes them, its bias added by the
// kernels), for head dimensions 16 to 128, token counts below, at and past a tile (64), causal
// or not, one or more samples and heads. Prints one line a case and exits 1 if any misses its
// bound. Built and run by `src/emulated.rs`.
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

Errors run(int B, int H, int T, int D, bool causal, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    const int bh = B * H;
    const size_t n = size_t(bh) * T * D;
    // Drawn per (sample, head) as [B·H, T, D], the reference's layout.
    auto draw = [&](float scale) {
        std::vector<bf16> v(n);
        for (auto &x : v) x = __float2bfloat16(normal(rng) * scale);
        return v;
    };
    // The projection's product and its bias, [3, H, D]: the kernels add it as they load; the
    // reference reads q, k and v with it added and rounded to bf16, as a bias add stores them.
    const auto q_raw = draw(1.f), k_raw = draw(1.f), v_raw = draw(1.f), dout = draw(1.f);
    std::vector<float> bias(3 * size_t(H) * D);
    for (auto &b : bias) b = 0.5f * normal(rng);
    auto biased = [&](const std::vector<bf16> &x, int which) {
        std::vector<bf16> y(n);
        for (size_t i = 0; i < n; ++i) {
            const size_t h = i / (size_t(T) * D) % H, d = i % D;
            y[i] = __float2bfloat16(__bfloat162float(x[i]) + bias[(which * size_t(H) + h) * D + d]);
        }
        return y;
    };
    const auto q = biased(q_raw, 0), k = biased(k_raw, 1), v = biased(v_raw, 2);
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
            // The kernels' lse is of the scores without k's bias (attention.cu, top), which
            // shifts a row's scores by scale · q·bk and so changes none of its probabilities.
            double raw_mx = -1e300, raw_sum = 0;
            std::vector<double> raw(T, -1e300);
            for (int j = 0; j <= (causal ? i : T - 1); ++j) {
                double s = 0;
                for (int d = 0; d < D; ++d) s += f(q[base + i * D + d]) * f(k_raw[base + j * D + d]);
                raw[j] = scale * s;
                raw_mx = std::max(raw_mx, raw[j]);
            }
            for (int j = 0; j <= (causal ? i : T - 1); ++j) raw_sum += std::exp(raw[j] - raw_mx);
            lse_ref[size_t(b) * T + i] = raw_mx + std::log(raw_sum);
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

    // The kernels' layouts: q, k, v (and their gradient) as a projection writes them, [B, T, 3,
    // H, D]; o, dO and dq's accumulator [B, T, H, D]; lse and the row dots [B, T, H]. Element d
    // of token i of head h of sample b: at qkv_at(b, h, i) + d + which · H·D (which: q, k, v), at
    // o_at(b, h, i) + d. Outputs start as NaN, so an element never written fails the check.
    const int ld_qkv = 3 * H * D, ld_o = H * D;
    auto qkv_at = [&](int b, int h, int i) { return (size_t(b) * T + i) * ld_qkv + size_t(h) * D; };
    auto o_at = [&](int b, int h, int i) { return (size_t(b) * T + i) * ld_o + size_t(h) * D; };
    auto row_at = [&](int b, int h, int i) { return (size_t(b) * T + i) * H + h; };
    const bf16 nan16 = __float2bfloat16(NAN);
    std::vector<bf16> qkv(3 * n), o(n, nan16), dqkv(3 * n, nan16), g(n);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int i = 0; i < T; ++i)
                for (int d = 0; d < D; ++d) {
                    const size_t from = (size_t(b * H + h) * T + i) * D + d, at = qkv_at(b, h, i) + d;
                    qkv[at] = q_raw[from];
                    qkv[at + ld_o] = k_raw[from];
                    qkv[at + 2 * ld_o] = v_raw[from];
                    g[o_at(b, h, i) + d] = dout[from];
                }
    std::vector<float> lse(size_t(bh) * T, NAN), dd(size_t(bh) * T, NAN), dq32(n, 0.f);
    const unsigned tiles = (T + TILE - 1) / TILE;
    const int c = causal;
    const bf16 *q_at = qkv.data(), *k_at = q_at + ld_o, *v_at = k_at + ld_o;
    const float *bq = bias.data(), *bk = bq + ld_o, *bv = bk + ld_o;
    bf16 *dq_at = dqkv.data(), *dk_at = dq_at + ld_o, *dv_at = dk_at + ld_o;
    size_t fwd = FWD_SMEM(D), bwd = BWD_SMEM(D);
    auto forward = [&] {
        switch (D) {
#define CASE(d) case d: mosaic_flash_forward_##d(q_at, k_at, v_at, bq, bk, bv, ld_qkv, o.data(), ld_o, lse.data(), T, H, c, scale); break;
            CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128)
#undef CASE
        }
    };
    auto backward = [&] {
        switch (D) {
#define CASE(d) case d: mosaic_flash_backward_##d(q_at, k_at, v_at, bq, bk, bv, ld_qkv, g.data(), ld_o, lse.data(), dd.data(), dq32.data(), dk_at, dv_at, T, H, c, scale); break;
            CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128)
#undef CASE
        }
    };
    launch(tiles, bh, THREADS, fwd, forward);
    const int rows = bh * T;
    launch((rows + 3) / 4, 1, 128, 0, [&] { mosaic_flash_row_dot(o.data(), g.data(), dd.data(), rows, D); });
    launch(tiles, bh, THREADS, bwd, backward);
    const unsigned long long count = n, width = ld_o, ld = ld_qkv;
    launch(2, 1, 256, 0, [&] { mosaic_f32_to_bf16_rows(dq32.data(), dq_at, count, width, ld); });

    // Back to the reference's layout.
    std::vector<float> o_got(n), lse_got(size_t(bh) * T), dq(n), dk(n), dv(n);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int i = 0; i < T; ++i) {
                const size_t to = size_t(b * H + h) * T + i;
                lse_got[to] = lse[row_at(b, h, i)];
                for (int d = 0; d < D; ++d) {
                    const size_t at = qkv_at(b, h, i) + d;
                    o_got[to * D + d] = __bfloat162float(o[o_at(b, h, i) + d]);
                    dq[to * D + d] = __bfloat162float(dqkv[at]);
                    dk[to * D + d] = __bfloat162float(dqkv[at + ld_o]);
                    dv[to * D + d] = __bfloat162float(dqkv[at + 2 * ld_o]);
                }
            }
    Errors e;
    e.o = relative(o_got, o_ref, 1e-2);
    e.lse = relative(lse_got, lse_ref, 1e-2);
    e.dq = relative(dq, dq_ref, 1e-2);
    e.dk = relative(dk, dk_ref, 1e-2);
    e.dv = relative(dv, dv_ref, 1e-2);
    return e;
}

}  // namespace

int main() {
    // Samples B and heads H apart, so that the strides between tokens, heads and samples are
    // all exercised.
    struct Case {
        int B, H, T, D;
        bool causal;
    };
    const Case cases[] = {
        {2, 1, 1, 64, false},  {1, 2, 37, 64, true},    {2, 1, 64, 16, false}, {1, 1, 130, 64, true},
        {1, 1, 130, 48, false}, {1, 1, 77, 80, true},   {1, 1, 70, 128, false}, {1, 1, 65, 32, true},
        {1, 1, 20, 96, false},  {1, 1, 20, 112, true},  {1, 3, 200, 64, true},  {3, 2, 45, 48, false},
    };
    // bf16 probabilities and dS (as FlashAttention keeps them) bound the agreement.
    const double bound = 2e-2;
    bool ok = true;
    unsigned seed = 1;
    for (const Case &c : cases) {
        const Errors e = run(c.B, c.H, c.T, c.D, c.causal, seed++);
        const double worst = std::max({e.o, e.lse, e.dq, e.dk, e.dv});
        const bool pass = worst < bound && std::isfinite(worst);
        ok = ok && pass;
        std::printf("%s B=%d H=%d T=%d D=%d causal=%d: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
                    pass ? "pass" : "FAIL", c.B, c.H, c.T, c.D, int(c.causal), e.o, e.lse, e.dq, e.dk,
                    e.dv);
    }
    return ok ? 0 : 1;
}
