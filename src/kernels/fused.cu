// Fused kernels of the candle engine (#10), compiled to PTX by build.rs with `--features cuda`.
// Each kernel replaces a chain of candle ops that each read and wrote the whole tensor; the
// arithmetic is the same (f32 inside, one rounding to the storage type at the end).
// Names end in the storage type: _f32, _bf16, _f16 (candle's kernel_name convention).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
// Sum / max over the block, returned to every thread. sh: 32 floats of shared memory.
__device__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from the previous reduction
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = warp_sum(lane < nw ? sh[lane] : 0.f);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}
__device__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = warp_max(lane < nw ? sh[lane] : -INFINITY);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

// ---------------------------------------------------------------------------------------------
// Attention softmax, one block per row of scores.
//   s:    (B, nh, Tq, Tk) raw q·kᵀ (unscaled), storage type T
//   bias: (B, bh, Tq, Tk) f32, bh = 1 (shared by heads) or nh: causal + padding (+ ALiBi)
//   keep: (B, nh, Tq, Tk) u8 dropout keep-mask, or null
// out = softmax(scale·s + bias) ⊙ keep · keep_scale; p_out (optional): the same without dropout
// (the backward needs both). Replaces affine, cast to f32, broadcast add, softmax, dropout
// mul / affine and the cast back: seven passes over (B, nh, T, T) become one.
template <typename T>
__device__ void attn_softmax_fwd(const T* s, const float* bias, const uint8_t* keep, T* out, T* p_out,
                                 float scale, float keep_scale, int nh, int bh, int tq, int tk) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const long b = row / ((long)nh * tq), h = (row / tq) % nh, q = row % tq;
  const T* sr = s + row * tk;
  const float* br = bias + ((b * bh + (bh == 1 ? 0 : h)) * tq + q) * tk;
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) mx = fmaxf(mx, to_f(sr[k]) * scale + br[k]);
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) sum += expf(to_f(sr[k]) * scale + br[k] - mx);
  const float inv = 1.f / block_sum(sum, sh);
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float p = expf(to_f(sr[k]) * scale + br[k] - mx) * inv;
    if (p_out) p_out[row * tk + k] = from_f<T>(p);
    out[row * tk + k] = from_f<T>(keep ? (keep[row * tk + k] ? p * keep_scale : 0.f) : p);
  }
}

// Backward of attn_softmax_fwd w.r.t. the raw scores s, one block per row.
//   p:   softmax probabilities without dropout; dpd: gradient w.r.t. the dropped probabilities
//   ds = scale · p ⊙ (dp − Σ_k p·dp),  dp = dpd ⊙ keep · keep_scale
template <typename T>
__device__ void attn_softmax_bwd(const T* p, const T* dpd, const uint8_t* keep, T* ds, float scale,
                                 float keep_scale, int tk) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* pr = p + row * tk;
  const T* gr = dpd + row * tk;
  const uint8_t* kr = keep ? keep + row * tk : nullptr;
  float dot = 0.f;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float dp = kr ? (kr[k] ? to_f(gr[k]) * keep_scale : 0.f) : to_f(gr[k]);
    dot += to_f(pr[k]) * dp;
  }
  dot = block_sum(dot, sh);
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float dp = kr ? (kr[k] ? to_f(gr[k]) * keep_scale : 0.f) : to_f(gr[k]);
    ds[row * tk + k] = from_f<T>(scale * to_f(pr[k]) * (dp - dot));
  }
}

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// AdamW, torch's single-tensor order (src/train.rs AdamW), in two passes over a parameter
// instead of ~12 candle ops. State mv: (2, n) f32, the first and second moments.
// Pass 1: mv' = (m + (1 − β1)(g − m), β2·v + (1 − β2)·g²), a new tensor.
template <typename T>
__device__ void adam_moments(const float* mv, const T* grad, float* out, long n, float beta1, float beta2) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const float g = to_f(grad[i]), m = mv[i], v = mv[n + i];
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

#define FOR_TYPES(M) M(float, f32) M(__nv_bfloat16, bf16) M(__half, f16)
#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_attn_softmax_fwd_##S(const T* s, const float* bias, const uint8_t* keep,     \
                                                     T* out, T* p_out, float scale, float keep_scale, int nh, \
                                                     int bh, int tq, int tk) {                                \
    attn_softmax_fwd<T>(s, bias, keep, out, p_out, scale, keep_scale, nh, bh, tq, tk);                        \
  }                                                                                                           \
  extern "C" __global__ void tb_attn_softmax_bwd_##S(const T* p, const T* dpd, const uint8_t* keep, T* ds,    \
                                                     float scale, float keep_scale, int tk) {                 \
    attn_softmax_bwd<T>(p, dpd, keep, ds, scale, keep_scale, tk);                                             \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_fwd_##S(const T* x, const T* bias, T* y, long rows, int n, int act) { \
    bias_act_fwd<T>(x, bias, y, rows, n, act);                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_##S(const T* x, const T* bias, const T* dy, T* dx, long rows,    \
                                                 int n, int act) {                                            \
    bias_act_bwd<T>(x, bias, dy, dx, rows, n, act);                                                           \
  }                                                                                                           \
  extern "C" __global__ void tb_adam_moments_##S(const float* mv, const T* grad, float* out, long n,         \
                                                 float beta1, float beta2) {                                  \
    adam_moments<T>(mv, grad, out, n, beta1, beta2);                                                          \
  }                                                                                                           \
  extern "C" __global__ void tb_adamw_apply_##S(T* param, const float* mv, long n, float decay,               \
                                               float step_size, float bc2_sqrt, float eps) {                  \
    adamw_apply<T>(param, mv, n, decay, step_size, bc2_sqrt, eps);                                            \
  }
FOR_TYPES(INSTANTIATE)
