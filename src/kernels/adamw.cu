// AdamW (#10) in two passes, and the gradient norm's Σ x²; launched by adamw.rs.
// Shapes: param, grad, x (n,) storage type T, flat; mv (2, n) f32 (first, second moment);
// out of sum_squares (1,) f32. Grid-stride loops over n.
#include "common.cuh"

// AdamW, torch's single-tensor order (`train::AdamW`, src/train/optim.rs), in two passes over a
// parameter instead of ~12 candle ops. State mv: (2, n) f32, the first and second moments.
// Pass 1: mv' = (m + (1 − β1)(g − m), β2·v + (1 − β2)·g²), a new tensor.
// gscale: the gradient's factor (clip coefficient over the loss scale).
template <typename T>
__device__ void adam_moments(const float* mv, const T* grad, float* out, long n, float beta1, float beta2,
                             float gscale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const float g = to_f(grad[i]) * gscale, m = mv[i], v = mv[n + i];
    out[i] = m + (1.f - beta1) * (g - m);  // torch's lerp form
    out[n + i] = beta2 * v + (1.f - beta2) * g * g;
  }
}
// Pass 2, in place: p ← p·(1 − lr·wd) − step_size · m / (√v / √(1 − β2ᵗ) + ε), step_size = lr / (1 − β1ᵗ).
template <typename T>
__device__ void adamw_apply(T* param, const float* mv, long n, float decay, float step_size, float bc2_sqrt, float eps) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const float p = to_f(param[i]) * decay;
    param[i] = from_f<T>(p - step_size * mv[i] / (sqrtf(mv[n + i]) / bc2_sqrt + eps));
  }
}

// Σ x² into *out (zeroed by the caller): per-block sums, one atomic add per block.
template <typename T>
__device__ void sum_squares(const T* x, float* out, long n) {
  __shared__ float sh[32];
  float s = 0.f;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const float v = to_f(x[i]);
    s += v * v;
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_adam_moments_##S(const float* mv, const T* grad, float* out, long n,         \
                                                 float beta1, float beta2, float gscale) {                    \
    adam_moments<T>(mv, grad, out, n, beta1, beta2, gscale);                                                  \
  }                                                                                                           \
  extern "C" __global__ void tb_sum_squares_##S(const T* x, float* out, long n) {                             \
    sum_squares<T>(x, out, n);                                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_adamw_apply_##S(T* param, const float* mv, long n, float decay,               \
                                               float step_size, float bc2_sqrt, float eps) {                  \
    adamw_apply<T>(param, mv, n, decay, step_size, bc2_sqrt, eps);                                            \
  }
FOR_TYPES(INSTANTIATE)
