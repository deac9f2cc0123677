// Bias + activation (#10), forward and backward; launched by bias_act.rs.
// Shapes: x, y, dy, dx (rows, n) contiguous, bias (n,), all storage type T; db (n,) f32.
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

// The bias gradient db = Σ_rows dy (f32), in two passes so that the sum's order is fixed:
// pass 1, grid (column blocks of 32, row chunks): each block sums its chunk of rows for 32
// columns (threads along y take every blockDim.y-th row) into part (chunks, n);
// pass 2 sums the chunks of each column in order. candle's sum(0) ran one slow pass.
template <typename T>
__device__ void col_sum_part(const T* x, float* part, long rows, int n) {
  __shared__ float sh[16][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const long per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const long r1 = r0 + per < rows ? r0 + per : rows;
  float s = 0.f;
  if (c < n)
    for (long r = r0 + threadIdx.y; r < r1; r += blockDim.y) s += to_f(x[r * n + c]);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float t = 0.f;
    for (int y = 0; y < blockDim.y; ++y) t += sh[y][threadIdx.x];
    part[blockIdx.y * (long)n + c] = t;
  }
}
extern "C" __global__ void tb_col_sum_finish(const float* part, float* out, int chunks, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float t = 0.f;
  for (int k = 0; k < chunks; ++k) t += part[(long)k * n + c];
  out[c] = t;
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_bias_act_fwd_##S(const T* x, const T* bias, T* y, long rows, int n, int act) { \
    bias_act_fwd<T>(x, bias, y, rows, n, act);                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_##S(const T* x, const T* bias, const T* dy, T* dx, long rows,    \
                                                 int n, int act) {                                            \
    bias_act_bwd<T>(x, bias, dy, dx, rows, n, act);                                                           \
  }                                                                                                           \
  extern "C" __global__ void tb_col_sum_part_##S(const T* x, float* part, long rows, int n) {                 \
    col_sum_part<T>(x, part, rows, n);                                                                        \
  }
FOR_TYPES(INSTANTIATE)
