// What the emulated kernels' checks share.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

/// Largest |a − b| over the largest |b|, that at least `floor` (a reference that is all but 0
/// leaves only the kernel's rounding); infinite where a value of `a` is not finite (never
/// written, or overflowed).
inline double relative(const std::vector<float> &a, const std::vector<double> &b, double floor) {
    double err = 0, scale = floor;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        err = std::max(err, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return err / scale;
}
