// Bias + activation (#10), forward and backward; launched by bias_act.rs.
// Shapes: x, y, dy, dx (rows, n) contiguous, bias (n,), all storage type T.
#include "common.cuh"

// Bias + activation over (rows, n), contiguous: y = act(x + bias). act: 0 none, 1 GELU (tanh
// approximation: gelu_new, bloom_gelu), 2 GELU (erf), 3 ReLU. candle's broadcast add indexes
// the bias through the generic strided path, and the activation is a second pass.
__device__ __forceinline__ float act_f(float x, int act) {
  switch (act) {
    case 1: return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case 2: return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
    case 3: return fmaxf(x, 0.f);
    default: return x;
  }
}
__device__ __forceinline__ float act_grad(float x, int act) {
  switch (act) {
    case 1: {
      const float c = 0.7978845608028654f, t = tanhf(c * (x + 0.044715f * x * x * x));
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * c * (1.f + 3.f * 0.044715f * x * x);
    }
    case 2: return 0.5f * (1.f + erff(x * 0.7071067811865476f)) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
    case 3: return x > 0.f ? 1.f : 0.f;
    default: return 1.f;
  }
}
// grid: (column blocks, row blocks); each thread walks rows with a grid stride.
template <typename T>
__device__ void bias_act_fwd(const T* x, const T* bias, T* y, long rows, int n, int act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const float bc = to_f(bias[c]);
  for (long r = blockIdx.y; r < rows; r += gridDim.y) y[r * n + c] = from_f<T>(act_f(to_f(x[r * n + c]) + bc, act));
}
// dx = dy ⊙ act'(x + bias), x the pre-bias input.
template <typename T>
__device__ void bias_act_bwd(const T* x, const T* bias, const T* dy, T* dx, long rows, int n, int act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const float bc = to_f(bias[c]);
  for (long r = blockIdx.y; r < rows; r += gridDim.y) {
    const long i = r * n + c;
    dx[i] = from_f<T>(to_f(dy[i]) * act_grad(to_f(x[i]) + bc, act));
  }
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_bias_act_fwd_##S(const T* x, const T* bias, T* y, long rows, int n, int act) { \
    bias_act_fwd<T>(x, bias, y, rows, n, act);                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_##S(const T* x, const T* bias, const T* dy, T* dx, long rows,    \
                                                 int n, int act) {                                            \
    bias_act_bwd<T>(x, bias, dy, dx, rows, n, act);                                                           \
  }
FOR_TYPES(INSTANTIATE)
