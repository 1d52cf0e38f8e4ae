// AdamW (Loshchilov and Hutter, ICLR 2019) on one parameter tensor in one pass: reads the
// parameter, its gradient and both moments once and writes the parameter and the moments in
// place. The same update as the engine's composed one (`runtime/optim/mod.rs`), which takes
// 16 kernels and as many passes over memory per tensor; PyTorch's fused AdamW, which the shared
// H100 measurements trained with, is likewise one pass.
//
// Compiled to a fatbin by the engine's build script, for the GPU build only.

extern "C" __global__ void mosaic_adamw_f32(
    float *__restrict__ theta,
    float *__restrict__ m,
    float *__restrict__ v,
    const float *__restrict__ g,
    unsigned long long n,
    float lr,
    float beta1,
    float beta2,
    float one_minus_beta1,  // 1 - beta1 and 1 - beta2, from the host's f64: in f32,
    float one_minus_beta2,  // 1 - 0.999f is off by 1.3e-5 relative
    float eps,
    float decay,  // 1 - lr * weight decay
    float bias1,  // 1 - beta1^t
    float bias2)  // 1 - beta2^t
{
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        float gi = g[i];
        float mi = beta1 * m[i] + one_minus_beta1 * gi;
        float vi = beta2 * v[i] + one_minus_beta2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float update = (mi / bias1) / (sqrtf(vi / bias2) + eps);
        theta[i] = theta[i] * decay - lr * update;
    }
}
