// Decode kernels (#20): the launches one generated token spends, fused; launched by decode.rs.
// Shapes: B batch, nh heads (of this rank), hs head size, C channels, T_max cached positions,
// V vocabulary.
#include "common.cuh"

// Added to the score of a padding key: attention.rs's MASKED (finite, so that a row of padding
// gives a uniform softmax, not NaN).
#define MASKED (-1e9f)

// s = x + r (rounded to T, as the composed add), y = LayerNorm(s)·w + b, statistics in f32
// (two passes: mean, then the biased variance, as torch). With r null: y = LayerNorm(x), s
// not written. One block per row of C: at decode's few rows (B) every SM that works has a
// whole block, where candle's layer norm took 15.6 µs for one row of 768.
//   x, r, s, y: (rows, C); w, b: (C,)
template <typename T>
__device__ void add_layer_norm(const T* x, const T* r, const T* w, const T* b, T* s, T* y, int c, float eps) {
  __shared__ float sh[32];
  const long off = (long)blockIdx.x * c;
  // The row this thread reads back: s where it wrote it (the same j, so no sync), else x.
  const T* src = r ? s + off : x + off;
  float sum = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    float v = to_f(x[off + j]);
    if (r) {
      const T t = from_f<T>(v + to_f(r[off + j]));
      s[off + j] = t;
      v = to_f(t);
    }
    sum += v;
  }
  const float mean = block_sum(sum, sh) / c;
  float var = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = to_f(src[j]) - mean;
    var += d * d;
  }
  const float rstd = rsqrtf(block_sum(var, sh) / c + eps);
  for (int j = threadIdx.x; j < c; j += blockDim.x)
    y[off + j] = from_f<T>((to_f(src[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}

// One new query per row against every cached key, one block per (row b, head h):
//   qkv:  (B, ·) row stride `qkv_stride`; head h's q at h·head_stride, its k at + part, its v
//         at + 2·part (GPT-2 [q | k | v]: head_stride hs, part C; BLOOM (nh, 3, hs): 3·hs, hs)
//   kc, vc: (B, nh, T_max, hs) the cache; the new k and v are written at position `pos`
//   key_mask: (B, T_max) f32, 1 real / 0 padding; keys 0..pos (inclusive) are attended
//   slopes: (nh,) f32 ALiBi slopes or null; key_pos: (B, T_max) f32 key positions (with slopes)
//   out:  (B, nh·hs), heads merged
//   cursor: null, or (1,) u32 positions written after this step's (a CUDA graph replays the
//         step at each position: pos = *cursor − 1 then, read on the device)
// Scores round through T as the composed q·kᵀ matmul's output, probabilities as the fused
// softmax's; sums in f32. Replaces the split-heads copies, the two cache copies, q·kᵀ, the
// softmax, p·v and the merge copy: eight launches a layer become one.
// Dynamic shared memory: (hs + pos + 1 + blockDim.x) floats (with a cursor: T_max for pos + 1).
template <typename T>
__device__ void decode_attention(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                 const float* key_mask, const float* slopes, const float* key_pos, T* out,
                                 float scale, int nh, int hs, int t_max, int pos_arg, const uint32_t* cursor) {
  extern __shared__ float smem[];
  const int pos = cursor ? (int)*cursor - 1 : pos_arg;
  const int tk = pos + 1;
  float* q = smem;            // (hs,)
  float* p = smem + hs;       // (tk,) scores, then probabilities
  float* acc = p + tk;        // (blockDim.x,) partial p·v sums
  __shared__ float sh[32];
  const int b = blockIdx.x / nh, h = blockIdx.x % nh;
  const T* qr = qkv + b * qkv_stride + (long)h * head_stride;
  const long head_off = ((long)b * nh + h) * t_max * hs;
  T* kr = kc + head_off;
  T* vr = vc + head_off;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    q[d] = to_f(qr[d]);
    kr[(long)pos * hs + d] = qr[part + d];
    vr[(long)pos * hs + d] = qr[2 * part + d];
  }
  __syncthreads();  // q and the new key and value are visible to the whole block
  const float* mrow = key_mask + (long)b * t_max;
  const float slope = slopes ? slopes[h] : 0.f;
  // Scores: a thread a key, the dot product over hs in registers (independent loads).
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const T* ks = kr + (long)k * hs;
    float dot = 0.f;
    for (int d = 0; d < hs; ++d) dot += q[d] * to_f(ks[d]);
    float sc = to_f(from_f<T>(dot)) * scale + (1.f - mrow[k]) * MASKED;
    if (slopes) sc += slope * key_pos[(long)b * t_max + k];
    p[k] = sc;
    mx = fmaxf(mx, sc);
  }
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) {
    const float e = expf(p[k] - mx);
    p[k] = e;
    sum += e;
  }
  const float inv = 1.f / block_sum(sum, sh);  // its __syncthreads publish p
  // p·v: thread (group g, dim d), the groups split the keys; coalesced reads of v rows.
  const int groups = blockDim.x / hs, g = threadIdx.x / hs, d = threadIdx.x % hs;
  float a = 0.f;
  if (g < groups)
    for (int k = g; k < tk; k += groups) a += to_f(from_f<T>(p[k] * inv)) * to_f(vr[(long)k * hs + d]);
  acc[threadIdx.x] = a;
  __syncthreads();
  for (int j = threadIdx.x; j < hs; j += blockDim.x) {
    float o = 0.f;
    for (int gi = 0; gi < groups; ++gi) o += acc[gi * hs + j];
    out[(long)b * nh * hs + (long)h * hs + j] = from_f<T>(o);
  }
}

// Greedy pick: the first index of the largest x[row, j] + ban[j] (ban: (V,) 0 or −inf, or
// null), one block per row. Two-level (warp, then block) reduction of (value, index) pairs,
// where candle's argmax over V = 50257 took 41 µs at batch 1.
//   x: (B, V); out: (B,) u32
__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}
template <typename T>
__device__ void argmax_rows(const T* x, const T* ban, uint32_t* out, int v) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const T* xr = x + (long)blockIdx.x * v;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    float val = to_f(xr[j]);
    if (ban) val = to_f(from_f<T>(val + to_f(ban[j])));
    better(best, idx, val, j);
  }
  for (int o = 16; o > 0; o >>= 1)
    better(best, idx, __shfl_xor_sync(0xffffffff, best, o), __shfl_xor_sync(0xffffffff, idx, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {
    sv[w] = best;
    si[w] = idx;
  }
  __syncthreads();
  if (w == 0) {
    best = lane < nw ? sv[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1)
      better(best, idx, __shfl_xor_sync(0xffffffff, best, o), __shfl_xor_sync(0xffffffff, idx, o));
    // A row of NaN or −inf only: index 0, as no index won.
    if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0u : (uint32_t)idx;
  }
}

// The cache bookkeeping of one decode step at the position in `cursor` (device memory, so that
// a CUDA graph of the step replays at every position): each row's new token is real; its
// position is the row's real tokens so far. One block:
//   mask, key_pos: (B, T_max) f32, written at *cursor; seen: (B,) f32 real tokens per row,
//   advanced; positions: (B,) f32 out, the new tokens' positions; cursor: (1,) u32, advanced.
extern "C" __global__ void tb_decode_begin(float* mask, float* key_pos, float* seen, float* positions,
                                           uint32_t* cursor, int b, int t_max) {
  const uint32_t pos = *cursor;
  for (int r = threadIdx.x; r < b; r += blockDim.x) {
    const float p = seen[r];
    mask[(long)r * t_max + pos] = 1.f;
    key_pos[(long)r * t_max + pos] = p;
    positions[r] = p;
    seen[r] = p + 1.f;
  }
  __syncthreads();  // every thread has read the cursor
  if (threadIdx.x == 0) *cursor = pos + 1;
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_add_layer_norm_##S(const T* x, const T* r, const T* w, const T* b, T* s, T* y, \
                                                   int c, float eps) {                                        \
    add_layer_norm<T>(x, r, w, b, s, y, c, eps);                                                              \
  }                                                                                                           \
  extern "C" __global__ void tb_decode_attention_##S(const T* qkv, long qkv_stride, int head_stride, int part, \
                                                     T* kc, T* vc, const float* key_mask, const float* slopes, \
                                                     const float* key_pos, T* out, float scale, int nh, int hs, \
                                                     int t_max, int pos, const uint32_t* cursor) {            \
    decode_attention<T>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, out, scale, nh, \
                        hs, t_max, pos, cursor);                                                              \
  }                                                                                                           \
  extern "C" __global__ void tb_argmax_##S(const T* x, const T* ban, uint32_t* out, int v) {                  \
    argmax_rows<T>(x, ban, out, v);                                                                           \
  }
FOR_TYPES(INSTANTIATE)
