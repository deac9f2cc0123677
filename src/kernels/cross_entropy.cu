// Cross-entropy (#10) over the logits, forward and backward; launched by cross_entropy.rs.
// Shapes: N rows, V the vocabulary, ld ≥ V the row length (a padded lm head);
//   x, dx (N, ld) storage type T; targets (N,) u32; loss, grad (N,) f32. One block per row.
#include "common.cuh"

// Next-token cross-entropy over (N, V) logits, one block per row, f32 inside. Forward:
// loss_i = logsumexp(x_i) − x_i[t_i]. Backward: dx_ij = g_i · (softmax(x_i)_j − [j = t_i]),
// the log-sum-exp recomputed from the row. candle's composed version casts the (N, V) logits
// to f32 and walks them about ten times (gpt2 at 8 × 1024 tokens: 1.6 GB per f32 copy).
template <typename T>
__device__ float row_logsumexp(const T* xr, int v, float* sh) {
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, to_f(xr[j]));
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) sum += expf(to_f(xr[j]) - mx);
  return logf(block_sum(sum, sh)) + mx;
}
// v: the vocabulary; ld ≥ v: the row length (a padded lm head's extra columns are ignored, and
// get a zero gradient).
template <typename T>
__device__ void xent_fwd(const T* x, const unsigned int* targets, float* loss, int v, int ld) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* xr = x + row * ld;
  const float lse = row_logsumexp(xr, v, sh);
  if (threadIdx.x == 0) loss[row] = lse - to_f(xr[targets[row]]);
}
template <typename T>
__device__ void xent_bwd(const T* x, const unsigned int* targets, const float* grad, T* dx, int v, int ld) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* xr = x + row * ld;
  const float lse = row_logsumexp(xr, v, sh), g = grad[row];
  const unsigned int t = targets[row];
  for (int j = threadIdx.x; j < ld; j += blockDim.x)
    dx[row * ld + j] = from_f<T>(j < v ? g * (expf(to_f(xr[j]) - lse) - (j == (int)t ? 1.f : 0.f)) : 0.f);
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_xent_fwd_##S(const T* x, const unsigned int* targets, float* loss, int v,     \
                                             int ld) {                                                        \
    xent_fwd<T>(x, targets, loss, v, ld);                                                                     \
  }                                                                                                           \
  extern "C" __global__ void tb_xent_bwd_##S(const T* x, const unsigned int* targets, const float* grad, T* dx, \
                                             int v, int ld) {                                                 \
    xent_bwd<T>(x, targets, grad, dx, v, ld);                                                                 \
  }
FOR_TYPES(INSTANTIATE)
