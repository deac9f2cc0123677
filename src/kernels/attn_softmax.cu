// Attention softmax (#10), forward and backward; launched by attn_softmax.rs.
// Shapes: B batch, nh heads, Tq query and Tk key positions, bh = 1 or nh;
//   s, out, p_out, p, dpd, ds: (B, nh, Tq, Tk) storage type T, one block per row of Tk
//   bias: (B, bh, Tq, Tk) f32; the keep-mask (dropout.cuh): u8 (B, nh, Tq, Tk), a hash or none
#include "common.cuh"
#include "dropout.cuh"

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
  }
FOR_TYPES(INSTANTIATE)
