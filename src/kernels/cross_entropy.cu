// Cross-entropy (#10) over the logits, forward and backward; launched by cross_entropy.rs.
// Shapes: N rows, V the vocabulary, ld ≥ V the row length (a padded lm head);
//   x, dx (N, ld) storage type T; targets (N,) u32; loss, grad (N,) f32. One block per row.
#include "common.cuh"

// Next-token cross-entropy over (N, V) logits, one block per row, f32 inside. Forward:
// loss_i = logsumexp(x_i) − x_i[t_i]. Backward: dx_ij = g_i · (softmax(x_i)_j − [j = t_i]),
// the log-sum-exp recomputed from the row. candle's composed version casts the (N, V) logits
// to f32 and walks them about ten times (gpt2 at 8 × 1024 tokens: 1.6 GB per f32 copy). Rows
// are read as 16-byte vectors where aligned, the log-sum-exp in one pass (online): the scalar
// two-pass version took 2.25 ms for gpt2's bf16 backward, about a quarter of the bandwidth.

// Online log-sum-exp (one read of the row, not two): m the running maximum, s = Σ exp(x − m).
__device__ __forceinline__ void online_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
// Whether a row can be read (and its gradient written) as 16-byte vectors: aligned, whole vectors.
template <typename T>
__device__ __forceinline__ bool vector_row(const void* a, const void* b, int ld) {
  return ((((uintptr_t)a) | ((uintptr_t)b)) & 15) == 0 && (ld * (int)sizeof(T)) % 16 == 0;
}
// logsumexp of xr[0..v), one read: 16-byte loads where `vec`, the vocabulary's tail scalar.
template <typename T>
__device__ float row_logsumexp(const T* xr, int v, bool vec, float* sh) {
  constexpr int N = 16 / sizeof(T);
  float m = -INFINITY, s = 0.f;
  int done = 0;
  if (vec) {
    const uint4* x4 = (const uint4*)xr;
    for (int k = threadIdx.x; k < v / N; k += blockDim.x) {
      const uint4 raw = x4[k];
      const T* e = (const T*)&raw;
#pragma unroll
      for (int q = 0; q < N; q++) online_add(to_f(e[q]), m, s);
    }
    done = v / N * N;
  }
  for (int j = done + threadIdx.x; j < v; j += blockDim.x) online_add(to_f(xr[j]), m, s);
  const float mx = block_max(m, sh);
  const float total = block_sum(m == -INFINITY ? 0.f : s * expf(m - mx), sh);
  return logf(total) + mx;
}
// v: the vocabulary; ld ≥ v: the row length (a padded lm head's extra columns are ignored, and
// get a zero gradient).
template <typename T>
__device__ void xent_fwd(const T* x, const unsigned int* targets, float* loss, int v, int ld) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* xr = x + row * ld;
  const float lse = row_logsumexp(xr, v, vector_row<T>(xr, xr, ld), sh);
  if (threadIdx.x == 0) loss[row] = lse - to_f(xr[targets[row]]);
}
__device__ __forceinline__ float xent_grad(float x, int j, float lse, float g, int v, unsigned int t) {
  return j < v ? g * (expf(x - lse) - (j == (int)t ? 1.f : 0.f)) : 0.f;
}
// dr[j] = g · (softmax(xr)_j − [j = t]) from the row's lse: 16-byte vectors where `vec`.
template <typename T>
__device__ void xent_grad_row(const T* xr, T* dr, float lse, float g, unsigned int t, int v, int ld, bool vec) {
  constexpr int N = 16 / sizeof(T);
  if (vec) {
    for (int k = threadIdx.x; k < ld / N; k += blockDim.x) {
      const uint4 raw = ((const uint4*)xr)[k];
      const T* e = (const T*)&raw;
      uint4 out;
      T* o = (T*)&out;
#pragma unroll
      for (int q = 0; q < N; q++) o[q] = from_f<T>(xent_grad(to_f(e[q]), k * N + q, lse, g, v, t));
      ((uint4*)dr)[k] = out;
    }
    return;
  }
  for (int j = threadIdx.x; j < ld; j += blockDim.x) dr[j] = from_f<T>(xent_grad(to_f(xr[j]), j, lse, g, v, t));
}
// Two reads of the row (the log-sum-exp, then the gradient) and one write.
template <typename T>
__device__ void xent_bwd(const T* x, const unsigned int* targets, const float* grad, T* dx, int v, int ld) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* xr = x + row * ld;
  T* dr = dx + row * ld;
  const bool vec = vector_row<T>(xr, dr, ld);
  const float lse = row_logsumexp(xr, v, vec, sh);
  xent_grad_row(xr, dr, lse, grad[row], targets[row], v, ld, vec);
}
// The forward and the backward in one pass, over the logits in place (the training step, whose
// loss gradient g is the same for every row and known before the forward): the loss, then the
// gradient written over the row. x[t] is read before the lse's block reductions, so before any
// thread writes. Two reads and one write, where the forward and backward kernels took three and one.
template <typename T>
__device__ void xent_fused(T* x, const unsigned int* targets, float* loss, float g, int v, int ld) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  T* xr = x + row * ld;
  const unsigned int t = targets[row];
  const float xt = threadIdx.x == 0 ? to_f(xr[t]) : 0.f;
  const bool vec = vector_row<T>(xr, xr, ld);
  const float lse = row_logsumexp(xr, v, vec, sh);
  if (threadIdx.x == 0) loss[row] = lse - xt;
  xent_grad_row(xr, xr, lse, g, t, v, ld, vec);
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_xent_fwd_##S(const T* x, const unsigned int* targets, float* loss, int v,     \
                                             int ld) {                                                        \
    xent_fwd<T>(x, targets, loss, v, ld);                                                                     \
  }                                                                                                           \
  extern "C" __global__ void tb_xent_bwd_##S(const T* x, const unsigned int* targets, const float* grad, T* dx, \
                                             int v, int ld) {                                                 \
    xent_bwd<T>(x, targets, grad, dx, v, ld);                                                                 \
  }                                                                                                           \
  /* In place: each thread writes only the elements it has just read, after the row's lse. */                \
  extern "C" __global__ void tb_xent_bwd_inplace_##S(T* x, const unsigned int* targets, const float* grad,     \
                                                     int v, int ld) {                                         \
    xent_bwd<T>(x, targets, grad, x, v, ld);                                                                  \
  }                                                                                                           \
  extern "C" __global__ void tb_xent_fused_##S(T* x, const unsigned int* targets, float* loss, float g, int v, \
                                               int ld) {                                                      \
    xent_fused<T>(x, targets, loss, g, v, ld);                                                                \
  }
FOR_TYPES(INSTANTIATE)
