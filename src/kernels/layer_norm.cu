// LayerNorm (#10), one kernel forward and two backward; launched by layer_norm.rs.
// Shapes: x, y, dy, dx (rows, C) storage type T, w and b (C,); part (⌈rows/LN_ROWS⌉, 2, C) f32.
#include "common.cuh"

// LayerNorm over the last dim C of (rows, C), statistics in f32: y = (x − μ)·rstd·w + b with
// rstd = 1/√(σ² + ε) (biased σ², as torch). One warp per row; the row stays in L1 between
// the passes. candle's differentiable layer_norm_slow is ~10 ops with casts each way; this is
// one kernel forward and two backward (dx; the dw/db partial sums).
template <typename T>
__device__ __forceinline__ void ln_stats(const T* xr, int c, float eps, float& mean, float& rstd) {
  const int lane = threadIdx.x & 31;
  float s = 0.f;
  for (int j = lane; j < c; j += 32) s += to_f(xr[j]);
  mean = warp_sum(s) / c;
  float v = 0.f;
  for (int j = lane; j < c; j += 32) {
    const float d = to_f(xr[j]) - mean;
    v += d * d;
  }
  rstd = 1.f / sqrtf(warp_sum(v) / c + eps);
}
template <typename T>
__device__ void layer_norm_fwd(const T* x, const T* w, const T* b, T* y, long rows, int c, float eps) {
  const long row = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * c;
  float mean, rstd;
  ln_stats(xr, c, eps, mean, rstd);
  for (int j = lane; j < c; j += 32) y[row * c + j] = from_f<T>((to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}
// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)),  g = dy ⊙ w, x̂ = (x − μ)·rstd.
template <typename T>
__device__ void layer_norm_bwd_x(const T* x, const T* w, const T* dy, T* dx, long rows, int c, float eps) {
  const long row = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * c;
  const T* gr = dy + row * c;
  float mean, rstd;
  ln_stats(xr, c, eps, mean, rstd);
  float sg = 0.f, sgx = 0.f;
  for (int j = lane; j < c; j += 32) {
    const float g = to_f(gr[j]) * to_f(w[j]);
    sg += g;
    sgx += g * (to_f(xr[j]) - mean) * rstd;
  }
  sg = warp_sum(sg) / c;
  sgx = warp_sum(sgx) / c;
  for (int j = lane; j < c; j += 32) {
    const float g = to_f(gr[j]) * to_f(w[j]), xh = (to_f(xr[j]) - mean) * rstd;
    dx[row * c + j] = from_f<T>(rstd * (g - sg - xh * sgx));
  }
}
// Partial column sums for dw = Σ dy ⊙ x̂ and db = Σ dy over LN_ROWS rows per block:
// part (gridDim.x, 2, C) f32, summed over blocks afterwards. Shared: 2·LN_ROWS floats.
#define LN_ROWS 16
template <typename T>
__device__ void layer_norm_bwd_wb(const T* x, const T* dy, float* part, long rows, int c, float eps) {
  __shared__ float stats[2 * LN_ROWS];
  const long r0 = blockIdx.x * (long)LN_ROWS;
  const int nr = (int)min((long)LN_ROWS, rows - r0);
  for (int r = threadIdx.x >> 5; r < nr; r += blockDim.x >> 5) {
    float mean, rstd;
    ln_stats(x + (r0 + r) * c, c, eps, mean, rstd);
    if ((threadIdx.x & 31) == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    float dw = 0.f, db = 0.f;
    for (int r = 0; r < nr; ++r) {
      const long i = (r0 + r) * c + j;
      const float g = to_f(dy[i]);
      dw += g * (to_f(x[i]) - stats[2 * r]) * stats[2 * r + 1];
      db += g;
    }
    part[(long)blockIdx.x * 2 * c + j] = dw;
    part[(long)blockIdx.x * 2 * c + c + j] = db;
  }
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_layer_norm_fwd_##S(const T* x, const T* w, const T* b, T* y, long rows, int c, \
                                                   float eps) {                                               \
    layer_norm_fwd<T>(x, w, b, y, rows, c, eps);                                                              \
  }                                                                                                           \
  extern "C" __global__ void tb_layer_norm_bwd_x_##S(const T* x, const T* w, const T* dy, T* dx, long rows,   \
                                                     int c, float eps) {                                      \
    layer_norm_bwd_x<T>(x, w, dy, dx, rows, c, eps);                                                          \
  }                                                                                                           \
  extern "C" __global__ void tb_layer_norm_bwd_wb_##S(const T* x, const T* dy, float* part, long rows, int c,  \
                                                      float eps) {                                            \
    layer_norm_bwd_wb<T>(x, dy, part, rows, c, eps);                                                          \
  }
FOR_TYPES(INSTANTIATE)
