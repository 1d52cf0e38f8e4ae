// Runs the kernels of `../elementwise.cu` on the CPU (this folder's emulation of CUDA) against
// the same mathematics in f64: LayerNorm's forward pass and its backward pass (∂x, and ∂γ, ∂β
// summed from the blocks' partial rows, as the host does), and both with y and its gradient in
// bf16; GELU's (in f32 and in bf16; the derivative itself checked against a central difference
// of GELU), and a bias added to a bf16 product (alone, with a residual connection, and under
// GELU, forward and backward) and its gradient summed over the rows. Prints one line a case and
// exits 1 if any misses its bound. Built and run by `src/emulated.rs`.
#include "../elementwise.cu"
#include "check.h"

#include <cstdio>
#include <random>

namespace {

bool report(const char *what, double err, double bound) {
    const bool pass = err < bound && std::isfinite(err);
    std::printf("%s %s: %.1e (bound %.0e)\n", pass ? "pass" : "FAIL", what, err, bound);
    return pass;
}

/// A row's mean and 1/√(variance + eps), in f64.
std::pair<double, double> stats(const float *xr, int dim, double eps) {
    double mean = 0, var = 0;
    for (int c = 0; c < dim; ++c) mean += xr[c];
    mean /= dim;
    for (int c = 0; c < dim; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    return {mean, 1 / std::sqrt(var / dim + eps)};
}

bool layer_norm(int rows, int dim, unsigned blocks, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    const float eps = 1e-5f;
    std::vector<float> x(size_t(rows) * dim), g(x.size()), gamma(dim), beta(dim);
    for (auto &v : x) v = 3.f + 2.f * normal(rng);  // rows off zero, as activations are
    for (auto &v : g) v = normal(rng);
    for (auto &v : gamma) v = 1.f + 0.5f * normal(rng);
    for (auto &v : beta) v = normal(rng);

    std::vector<double> dx_ref(x.size()), dgamma_ref(dim), dbeta_ref(dim);
    for (int r = 0; r < rows; ++r) {
        const float *xr = &x[size_t(r) * dim];
        const float *gr = &g[size_t(r) * dim];
        const auto [mean, rs] = stats(xr, dim, eps);
        double a = 0, b = 0;
        for (int c = 0; c < dim; ++c) {
            const double xh = (xr[c] - mean) * rs, gg = double(gr[c]) * gamma[c];
            a += gg;
            b += gg * xh;
            dgamma_ref[c] += gr[c] * xh;
            dbeta_ref[c] += gr[c];
        }
        a /= dim;
        b /= dim;
        for (int c = 0; c < dim; ++c) {
            const double xh = (xr[c] - mean) * rs;
            dx_ref[size_t(r) * dim + c] = rs * (double(gr[c]) * gamma[c] - a - xh * b);
        }
    }

    std::vector<double> y_ref(x.size());
    for (int r = 0; r < rows; ++r) {
        const float *xr = &x[size_t(r) * dim];
        const auto [mean, rs] = stats(xr, dim, eps);
        for (int c = 0; c < dim; ++c) y_ref[size_t(r) * dim + c] = (xr[c] - mean) * rs * gamma[c] + beta[c];
    }
    std::vector<float> y(x.size(), NAN);
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 0, [&] {
        mosaic_layer_norm_f32(x.data(), gamma.data(), beta.data(), y.data(), rows, dim, eps);
    });

    std::vector<float> dx(x.size(), NAN), part(size_t(blocks) * 2 * dim, NAN);
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 2 * dim * sizeof(float), [&] {
        mosaic_layer_norm_backward_f32(x.data(), gamma.data(), g.data(), dx.data(), part.data(), rows, dim, eps);
    });
    std::vector<float> dgamma(dim, 0.f), dbeta(dim, 0.f);
    for (unsigned b = 0; b < blocks; ++b)
        for (int c = 0; c < dim; ++c) {
            dgamma[c] += part[(size_t(b) * 2) * dim + c];
            dbeta[c] += part[(size_t(b) * 2 + 1) * dim + c];
        }
    char what[96];
    std::snprintf(what, sizeof what, "layer norm forward, %d rows × %d, %u blocks", rows, dim, blocks);
    const bool forward = report(what, relative(y, y_ref, 1e-6), 1e-5);
    std::snprintf(what, sizeof what, "layer norm backward, %d rows × %d, %u blocks", rows, dim, blocks);
    const double err = std::max({relative(dx, dx_ref, 1e-6), relative(dgamma, dgamma_ref, 1e-6), relative(dbeta, dbeta_ref, 1e-6)});
    const bool backward = report(what, err, 1e-4);

    // For a bf16 product: y written in bf16 must be the f32 y rounded once, and the backward
    // pass reading a bf16 gradient must give the f32 kernel's ∂x from the same values, bit for
    // bit (what a cast after the norm and one before its backward pass gave); its ∂γ and ∂β
    // too, up to the order in which a block's atomics add.
    std::vector<__nv_bfloat16> y_b(x.size(), __float2bfloat16(NAN)), g_b(x.size());
    for (size_t i = 0; i < g.size(); ++i) g_b[i] = __float2bfloat16(g[i]);
    std::vector<float> g_wide(x.size()), dx_wide(x.size(), NAN), part_wide(part.size(), NAN);
    for (size_t i = 0; i < g.size(); ++i) g_wide[i] = __bfloat162float(g_b[i]);
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 0, [&] {
        mosaic_layer_norm_f32_to_bf16(x.data(), gamma.data(), beta.data(), y_b.data(), rows, dim, eps);
    });
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 2 * dim * sizeof(float), [&] {
        mosaic_layer_norm_backward_f32(x.data(), gamma.data(), g_wide.data(), dx_wide.data(), part_wide.data(), rows, dim, eps);
    });
    std::fill(dx.begin(), dx.end(), NAN);
    std::fill(part.begin(), part.end(), NAN);
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 2 * dim * sizeof(float), [&] {
        mosaic_layer_norm_backward_bf16_grad(x.data(), gamma.data(), g_b.data(), dx.data(), part.data(), rows, dim, eps);
    });
    auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        differ += bits(__bfloat162float(y_b[i])) != bits(__bfloat162float(__float2bfloat16(y[i])));
        differ += bits(dx[i]) != bits(dx_wide[i]);
    }
    std::snprintf(what, sizeof what, "layer norm in bf16, %d rows × %d: y and ∂x values differing", rows, dim);
    const bool same = report(what, double(differ), 0.5);
    std::snprintf(what, sizeof what, "layer norm in bf16, %d rows × %d: ∂γ, ∂β partials", rows, dim);
    const std::vector<double> wide(part_wide.begin(), part_wide.end());
    const bool partials = report(what, relative(part, wide, 1e-6), 1e-5);
    return forward && backward && same && partials;
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

bool gelu_backward(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-6.f, 6.f);
    std::normal_distribution<float> normal;
    const size_t n = 3001;
    std::vector<float> x(n), g(n);
    for (auto &v : x) v = uniform(rng);
    for (auto &v : g) v = normal(rng);
    std::vector<__nv_bfloat16> xb(n), gb(n), dxb(n, __float2bfloat16(NAN));
    for (size_t i = 0; i < n; ++i) {
        xb[i] = __float2bfloat16(x[i]);
        gb[i] = __float2bfloat16(g[i]);
    }
    // The derivative from a central difference of GELU itself, in f64.
    auto reference = [](double x, double g) {
        const double h = 1e-5;
        return g * (gelu(x + h) - gelu(x - h)) / (2 * h);
    };
    std::vector<double> ref(n), ref_b(n);
    for (size_t i = 0; i < n; ++i) {
        ref[i] = reference(x[i], g[i]);
        ref_b[i] = reference(__bfloat162float(xb[i]), __bfloat162float(gb[i]));
    }
    std::vector<float> dx(n, NAN);
    const unsigned long long count = n;
    emu::launch({2, 1, 1}, {256, 1, 1}, 0, [&] { mosaic_gelu_backward_f32(x.data(), g.data(), dx.data(), count); });
    emu::launch({2, 1, 1}, {256, 1, 1}, 0, [&] { mosaic_gelu_backward_bf16(xb.data(), gb.data(), dxb.data(), count); });
    std::vector<float> dx_b(n);
    for (size_t i = 0; i < n; ++i) dx_b[i] = __bfloat162float(dxb[i]);
    const bool f32 = report("gelu backward, f32", relative(dx, ref, 1e-6), 1e-5);
    const bool bf16 = report("gelu backward, bf16", relative(dx_b, ref_b, 1e-6), 1e-2);
    return f32 && bf16;
}

bool bias(int rows, int cols, unsigned gy, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<__nv_bfloat16> y(size_t(rows) * cols), g(y.size()), out(y.size(), __float2bfloat16(NAN));
    std::vector<float> b(cols);
    for (auto &v : y) v = __float2bfloat16(normal(rng));
    for (auto &v : g) v = __float2bfloat16(normal(rng));
    for (auto &v : b) v = normal(rng);
    std::vector<double> out_ref(y.size()), sums_ref(cols);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const size_t i = size_t(r) * cols + c;
            out_ref[i] = double(__bfloat162float(y[i])) + b[c];
            sums_ref[c] += __bfloat162float(g[i]);
        }
    std::vector<float> part(size_t(gy) * cols, NAN);
    const unsigned gx = (cols + 255) / 256;
    emu::launch({gx, gy, 1}, {256, 1, 1}, 0, [&] { mosaic_bias_add_bf16(y.data(), b.data(), out.data(), rows, cols); });
    emu::launch({gx, gy, 1}, {256, 1, 1}, 0, [&] { mosaic_column_sums_bf16(g.data(), part.data(), rows, cols); });
    std::vector<float> got(out.size()), sums(cols, 0.f);
    for (size_t i = 0; i < out.size(); ++i) got[i] = __bfloat162float(out[i]);
    for (unsigned p = 0; p < gy; ++p)
        for (int c = 0; c < cols; ++c) sums[c] += part[size_t(p) * cols + c];
    char what[96];
    std::snprintf(what, sizeof what, "bias add, %d rows × %d, %u row blocks", rows, cols, gy);
    const bool add = report(what, relative(got, out_ref, 1e-6), 1e-2);
    std::snprintf(what, sizeof what, "bias gradient, %d rows × %d, %u row blocks", rows, cols, gy);
    const bool gradient = report(what, relative(sums, sums_ref, 1e-6), 1e-5);

    // The same bias with a residual connection into an f32 stream x: the bias add's output
    // (above) cast to f32 and added to x, bit for bit; every element written.
    std::vector<float> x(y.size()), sum(y.size(), NAN);
    for (auto &v : x) v = 3.f * normal(rng);
    emu::launch({gx, gy, 1}, {256, 1, 1}, 0, [&] {
        mosaic_residual_bias_add_bf16(x.data(), y.data(), b.data(), sum.data(), rows, cols);
    });
    size_t differ = 0;
    for (size_t i = 0; i < y.size(); ++i)
        differ += std::bit_cast<uint32_t>(sum[i]) != std::bit_cast<uint32_t>(x[i] + __bfloat162float(out[i]));
    std::snprintf(what, sizeof what, "residual bias add, %d rows × %d: values differing", rows, cols);
    return add && gradient && report(what, double(differ), 0.5);
}

// The MLP's bias and GELU, forward and backward, against f64: out = gelu(bf16(y + b)) within
// bf16's rounding, dy = g·gelu'(bf16(y + b)) the same, and the bias's gradient (the partial
// rows summed as the host does) against the sums of the kernel's own dy.
bool bias_gelu(int rows, int cols, unsigned gy, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    const size_t n = size_t(rows) * cols;
    std::vector<__nv_bfloat16> y(n), g(n), out(n, __float2bfloat16(NAN)), dy(n, __float2bfloat16(NAN));
    std::vector<float> b(cols);
    for (auto &v : y) v = __float2bfloat16(2.f * normal(rng));
    for (auto &v : g) v = __float2bfloat16(normal(rng));
    for (auto &v : b) v = normal(rng);
    std::vector<double> out_ref(n), dy_ref(n);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const size_t i = size_t(r) * cols + c;
            const double pre = __bfloat162float(__float2bfloat16(__bfloat162float(y[i]) + b[c]));
            const double h = 1e-5;
            out_ref[i] = gelu(pre);
            dy_ref[i] = __bfloat162float(g[i]) * (gelu(pre + h) - gelu(pre - h)) / (2 * h);
        }
    std::vector<float> part(size_t(gy) * cols, NAN);
    const unsigned gx = (cols + 255) / 256;
    emu::launch({gx, gy, 1}, {256, 1, 1}, 0, [&] { mosaic_bias_gelu_bf16(y.data(), b.data(), out.data(), rows, cols); });
    emu::launch({gx, gy, 1}, {256, 1, 1}, 0, [&] {
        mosaic_bias_gelu_backward_bf16(y.data(), b.data(), g.data(), dy.data(), part.data(), rows, cols);
    });
    std::vector<float> out_f(n), dy_f(n), sums(cols, 0.f);
    std::vector<double> sums_ref(cols, 0.0);
    for (size_t i = 0; i < n; ++i) {
        out_f[i] = __bfloat162float(out[i]);
        dy_f[i] = __bfloat162float(dy[i]);
        sums_ref[i % cols] += dy_f[i];
    }
    for (unsigned p = 0; p < gy; ++p)
        for (int c = 0; c < cols; ++c) sums[c] += part[size_t(p) * cols + c];
    char what[96];
    std::snprintf(what, sizeof what, "bias and gelu, %d rows × %d, %u row blocks", rows, cols, gy);
    const bool forward = report(what, relative(out_f, out_ref, 1e-6), 1e-2);
    std::snprintf(what, sizeof what, "bias and gelu backward, %d rows × %d", rows, cols);
    const bool backward = report(what, relative(dy_f, dy_ref, 1e-6), 1e-2);
    std::snprintf(what, sizeof what, "bias and gelu: the bias's gradient, %d rows × %d", rows, cols);
    return forward && backward && report(what, relative(sums, sums_ref, 1e-6), 1e-5);
}

}  // namespace

int main() {
    bool ok = true;
    ok &= layer_norm(37, 64, 3, 1);
    ok &= layer_norm(5, 100, 1, 2);
    ok &= layer_norm(70, 1280, 4, 3);
    ok &= layer_norm(1, 33, 2, 4);  // a block with no row
    ok &= gelu_backward(5);
    ok &= bias(37, 300, 4, 6);
    ok &= bias(3, 64, 8, 7);  // more row blocks than rows
    ok &= bias_gelu(37, 300, 4, 8);
    ok &= bias_gelu(3, 64, 3, 9);
    return ok ? 0 : 1;
}
