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

// Eight consecutive elements of a row as f32 (one 16-byte load for bf16 / f16, two for f32),
// and back. The row pointer must be 16-byte aligned (the launcher checks).
__device__ __forceinline__ void load8(const float* p, float* v) {
  const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float* v) {
  *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
  *(float4*)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* v) {
  const uint4 u = *(const uint4*)p;
  const __nv_bfloat162* h = (const __nv_bfloat162*)&u;
  for (int i = 0; i < 4; ++i) { const float2 f = __bfloat1622float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float* v) {
  uint4 u;
  __nv_bfloat162* h = (__nv_bfloat162*)&u;
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *(uint4*)p = u;
}
__device__ __forceinline__ void load8(const __half* p, float* v) {
  const uint4 u = *(const uint4*)p;
  const __half2* h = (const __half2*)&u;
  for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void store8(__half* p, const float* v) {
  uint4 u;
  __half2* h = (__half2*)&u;
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *(uint4*)p = u;
}

// The same two kernels with one warp a row, for Tk ≤ NV·256 and Tk a multiple of 8: each lane
// keeps NV vectors of 8 in registers, so s and the bias are read once (vectorised), exp is
// taken once, and the reductions are warp shuffles without block barriers. The one-block
// versions above read s three times and spent 0.63 ms a layer on gpt2's (8, 12, 1024, 1024)
// training scores (ncu, results/h100/train-run2).
template <typename T, int NV>
__device__ void attn_softmax_fwd_warp(const T* s, const float* bias, Keep keep, T* out, T* p_out, float scale,
                                      int nh, int bh, int tq, int tk, long rows) {
  const long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const long b = row / ((long)nh * tq), h = (row / tq) % nh, q = row % tq;
  const T* sr = s + row * tk;
  const float* br = bias + ((b * bh + (bh == 1 ? 0 : h)) * tq + q) * tk;
  float v[NV][8];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int k0 = (j * 32 + lane) * 8;
    if (k0 < tk) {
      float bb[8];
      load8(sr + k0, v[j]);
      load8(br + k0, bb);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[j][e] = v[j][e] * scale + bb[e];
        mx = fmaxf(mx, v[j][e]);
      }
    }
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    if ((j * 32 + lane) * 8 < tk) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[j][e] = expf(v[j][e] - mx);
        sum += v[j][e];
      }
    }
  }
  const float inv = 1.f / warp_sum(sum);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int k0 = (j * 32 + lane) * 8;
    if (k0 < tk) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] *= inv;
      if (p_out) store8(p_out + row * tk + k0, v[j]);
      if (keep.active()) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[j][e] *= keep.at(row * tk + k0 + e);
      }
      store8(out + row * tk + k0, v[j]);
    }
  }
}

template <typename T, int NV>
__device__ void attn_softmax_bwd_warp(const T* p, const T* dpd, Keep keep, T* ds, float scale, int tk, long rows) {
  const long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float pv[NV][8], dp[NV][8];
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int k0 = (j * 32 + lane) * 8;
    if (k0 < tk) {
      load8(p + row * tk + k0, pv[j]);
      load8(dpd + row * tk + k0, dp[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dp[j][e] *= keep.at(row * tk + k0 + e);
        dot += pv[j][e] * dp[j][e];
      }
    }
  }
  dot = warp_sum(dot);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int k0 = (j * 32 + lane) * 8;
    if (k0 < tk) {
#pragma unroll
      for (int e = 0; e < 8; ++e) pv[j][e] = scale * pv[j][e] * (dp[j][e] - dot);
      store8(ds + row * tk + k0, pv[j]);
    }
  }
}

#define INSTANTIATE_WARP(T, S, NV)                                                                            \
  extern "C" __global__ void tb_attn_softmax_fwd_w##NV##_##S(                                                 \
      const T* s, const float* bias, const uint8_t* mask, unsigned long long key, unsigned int thresh, T* out, \
      T* p_out, float scale, float keep_scale, int nh, int bh, int tq, int tk, long rows) {                   \
    attn_softmax_fwd_warp<T, NV>(s, bias, Keep{mask, key, thresh, keep_scale}, out, p_out, scale, nh, bh, tq, \
                                 tk, rows);                                                                   \
  }                                                                                                           \
  extern "C" __global__ void tb_attn_softmax_bwd_w##NV##_##S(const T* p, const T* dpd, const uint8_t* mask,   \
                                                             unsigned long long key, unsigned int thresh,     \
                                                             T* ds, float scale, float keep_scale, int tk,    \
                                                             long rows) {                                     \
    attn_softmax_bwd_warp<T, NV>(p, dpd, Keep{mask, key, thresh, keep_scale}, ds, scale, tk, rows);           \
  }
#define INSTANTIATE_WARPS(T, S) INSTANTIATE_WARP(T, S, 1) INSTANTIATE_WARP(T, S, 2) INSTANTIATE_WARP(T, S, 4)
FOR_TYPES(INSTANTIATE_WARPS)

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
