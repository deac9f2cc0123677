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
// Dropout without a stored mask: element i of a tensor is kept when a counter-based hash of
// (key, i) (splitmix64's output function) is at least thresh = p·2³², as torch draws it with
// Philox from (seed, offset). The backward redraws the same bits from the same key, so the
// (B, nh, T, T) f32 uniforms and u8 mask of candle's rand + ge are never written.
__device__ __forceinline__ bool keep_bit(unsigned long long key, unsigned long long i, unsigned int thresh) {
  unsigned long long z = key + (i + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (unsigned int)(z >> 32) >= thresh;
}
// The keep factor of element i: from the u8 mask when there is one, else from the hash when
// thresh > 0, else 1 (no dropout).
struct Keep {
  const uint8_t* mask;
  unsigned long long key;
  unsigned int thresh;
  float scale;  // 1 / (1 − p)
  __device__ __forceinline__ bool active() const { return mask != nullptr || thresh != 0; }
  __device__ __forceinline__ float at(long i) const {
    if (mask) return mask[i] ? scale : 0.f;
    if (thresh) return keep_bit(key, (unsigned long long)i, thresh) ? scale : 0.f;
    return 1.f;
  }
};

// ---------------------------------------------------------------------------------------------
// Attention softmax, one block per row of scores.
//   s:    (B, nh, Tq, Tk) raw q·kᵀ (unscaled), storage type T
//   bias: (B, bh, Tq, Tk) f32, bh = 1 (shared by heads) or nh: causal + padding (+ ALiBi)
//   keep: the dropout keep-mask (a u8 (B, nh, Tq, Tk) tensor, the hash, or none)
// out = softmax(scale·s + bias) ⊙ keep / (1 − p); p_out (optional): the same without dropout
// (the backward needs both). Replaces affine, cast to f32, broadcast add, softmax, dropout
// mul / affine and the cast back: seven passes over (B, nh, T, T) become one.
template <typename T>
__device__ void attn_softmax_fwd(const T* s, const float* bias, Keep keep, T* out, T* p_out, float scale,
                                 int nh, int bh, int tq, int tk) {
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
    out[row * tk + k] = from_f<T>(keep.active() ? p * keep.at(row * tk + k) : p);
  }
}

// Backward of attn_softmax_fwd w.r.t. the raw scores s, one block per row.
//   p:   softmax probabilities without dropout; dpd: gradient w.r.t. the dropped probabilities
//   ds = scale · p ⊙ (dp − Σ_k p·dp),  dp = dpd ⊙ keep / (1 − p_drop)
template <typename T>
__device__ void attn_softmax_bwd(const T* p, const T* dpd, Keep keep, T* ds, float scale, int tk) {
  __shared__ float sh[32];
  const long row = blockIdx.x;
  const T* pr = p + row * tk;
  const T* gr = dpd + row * tk;
  float dot = 0.f;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float dp = to_f(gr[k]) * keep.at(row * tk + k);
    dot += to_f(pr[k]) * dp;
  }
  dot = block_sum(dot, sh);
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float dp = to_f(gr[k]) * keep.at(row * tk + k);
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

// ---------------------------------------------------------------------------------------------
// Dropout of a whole tensor with the hashed mask: y = x ⊙ keep / (1 − p). Its own backward
// (the same mask, the same scale), so one kernel serves both directions.
template <typename T>
__device__ void dropout_hash(const T* x, T* y, long n, unsigned long long key, unsigned int thresh, float scale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = from_f<T>(keep_bit(key, (unsigned long long)i, thresh) ? to_f(x[i]) * scale : 0.f);
}
// The hashed mask as u8 (1 = kept): for the composed-ops path and the tests.
extern "C" __global__ void tb_dropout_mask(uint8_t* out, long n, unsigned long long key, unsigned int thresh) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    out[i] = keep_bit(key, (unsigned long long)i, thresh) ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
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
#define LN_ROWS 64
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

// ---------------------------------------------------------------------------------------------
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

#define FOR_TYPES(M) M(float, f32) M(__nv_bfloat16, bf16) M(__half, f16)
#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_attn_softmax_fwd_##S(const T* s, const float* bias, const uint8_t* mask,     \
                                                     unsigned long long key, unsigned int thresh, T* out,     \
                                                     T* p_out, float scale, float keep_scale, int nh, int bh, \
                                                     int tq, int tk) {                                        \
    attn_softmax_fwd<T>(s, bias, Keep{mask, key, thresh, keep_scale}, out, p_out, scale, nh, bh, tq, tk);     \
  }                                                                                                           \
  extern "C" __global__ void tb_attn_softmax_bwd_##S(const T* p, const T* dpd, const uint8_t* mask,           \
                                                     unsigned long long key, unsigned int thresh, T* ds,      \
                                                     float scale, float keep_scale, int tk) {                 \
    attn_softmax_bwd<T>(p, dpd, Keep{mask, key, thresh, keep_scale}, ds, scale, tk);                          \
  }                                                                                                           \
  extern "C" __global__ void tb_xent_fwd_##S(const T* x, const unsigned int* targets, float* loss, int v,     \
                                             int ld) {                                                        \
    xent_fwd<T>(x, targets, loss, v, ld);                                                                     \
  }                                                                                                           \
  extern "C" __global__ void tb_xent_bwd_##S(const T* x, const unsigned int* targets, const float* grad, T* dx, \
                                             int v, int ld) {                                                 \
    xent_bwd<T>(x, targets, grad, dx, v, ld);                                                                 \
  }                                                                                                           \
  extern "C" __global__ void tb_dropout_##S(const T* x, T* y, long n, unsigned long long key,                 \
                                            unsigned int thresh, float scale) {                               \
    dropout_hash<T>(x, y, n, key, thresh, scale);                                                             \
  }                                                                                                           \
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
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_fwd_##S(const T* x, const T* bias, T* y, long rows, int n, int act) { \
    bias_act_fwd<T>(x, bias, y, rows, n, act);                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_##S(const T* x, const T* bias, const T* dy, T* dx, long rows,    \
                                                 int n, int act) {                                            \
    bias_act_bwd<T>(x, bias, dy, dx, rows, n, act);                                                           \
  }                                                                                                           \
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
