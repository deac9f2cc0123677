// Single-query attention over the KV cache (#20), one new position a row, and the cache
// bookkeeping of a graphed decode step; launched by decode_attention.rs.
// Shapes: B batch, nh heads (of this rank), hs head size, C channels, T_max cached positions.
#include "common.cuh"

// Added to the score of a padding key: attention.rs's MASKED (finite, so that a row of padding
// gives a uniform softmax, not NaN).
#define MASKED (-1e9f)

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

// decode_attention over a block's share of the keys (flash-decoding), for head sizes 64 and
// 128: block (row·head, s) takes keys [s·kpb, (s + 1)·kpb). With one block a head (gridDim.y
// 1) it writes the output; else its max score, its sum of exp(score − max) and its
// unnormalised p·v, which tb_decode_combine merges. Every load a round needs (q, keys, values,
// mask, positions) is issued at once, and the next round's before this round's arithmetic:
// the kernel before this one (8 warps a key each, q through shared memory, the mask read after
// the scores) waited on three dependent rounds of loads and cost 5.2–7.2 µs a layer at batch 1
// and 11–14 at batch 16 inside the graph (results/h100x2/ablate1), for 1–8 MB of cache.
// Lanes: a group of G = HS / EV lanes reads a key's row in 16-byte vectors (EV elements each);
// a warp holds KPW = 32 / G keys at a time, R of them a lane a round, and keeps a running max, sum
// and p·v (online softmax) for its keys; the warps' results meet in shared memory. The new
// position's key and value are read from qkv (and written to the cache by their block), so no
// block waits for its own write. Probabilities are not rounded to T before p·v (the merge
// needs the sums first); scores round through T as the composed q·kᵀ's output.
//   part_m, part_l: (B·nh, S); part_acc: (B·nh, S, HS); out (B, nh·HS) where S = 1; other
//   arguments as decode_attention
constexpr int SPLIT_WARPS = 8;  // blockDim.x == 256

template <typename T, int HS>
struct SplitRound {
  static constexpr int EV = 16 / sizeof(T), G = HS / EV, KPW = 32 / G;
  static constexpr int R = 2;  // keys a lane a round
  Vec16<T> k[R], v[R];
  float mask[R], kpos[R];
};

// The key of slot u of round `base` for this lane's group.
template <typename T, int HS>
__device__ __forceinline__ int round_key(int base, int u) {
  using S = SplitRound<T, HS>;
  return base + (u * SPLIT_WARPS + (threadIdx.x >> 5)) * S::KPW + (threadIdx.x & 31) / S::G;
}

// Round `base`'s loads for this lane (keys by round_key).
template <typename T, int HS>
__device__ __forceinline__ void load_round(SplitRound<T, HS>& r, int base, int hi, int pos, const T* kr,
                                           const T* vr, const T* qr, int part, const float* mrow,
                                           const float* prow, bool alibi) {
  using S = SplitRound<T, HS>;
  const int gl = (threadIdx.x & 31) % S::G;
#pragma unroll
  for (int u = 0; u < S::R; ++u) {
    const int j = round_key<T, HS>(base, u);
    if (j < hi) {
      const bool fresh = j == pos;  // the new position: from qkv
      const T* ks = fresh ? qr + part : kr + (long)j * HS;
      const T* vs = fresh ? qr + 2 * part : vr + (long)j * HS;
      r.k[u] = reinterpret_cast<const Vec16<T>*>(ks)[gl];
      r.v[u] = reinterpret_cast<const Vec16<T>*>(vs)[gl];
      r.mask[u] = mrow[j];
      r.kpos[u] = alibi ? prow[j] : 0.f;
    }
  }
}

// exp(a − b) with −inf − −inf as 0 (a running max before any key).
__device__ __forceinline__ float rescale(float a, float b) { return a == -INFINITY ? 0.f : expf(a - b); }

template <typename T, int HS>
__device__ void decode_attention_split(const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc,
                                       const float* key_mask, const float* slopes, const float* key_pos,
                                       float* part_m, float* part_l, float* part_acc, T* out, float scale, int nh,
                                       int t_max, int pos_arg, const uint32_t* cursor, int kpb) {
  using S = SplitRound<T, HS>;
  constexpr int EV = S::EV, G = S::G, KPR = SPLIT_WARPS * S::KPW * S::R;
  __shared__ float wm[SPLIT_WARPS], wl[SPLIT_WARPS], wacc[SPLIT_WARPS][HS];
  const int pos = cursor ? (int)*cursor - 1 : pos_arg;
  const int tk = pos + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gl = lane % G;
  const int bh = blockIdx.x, b = bh / nh, h = bh % nh, s = blockIdx.y;
  const int lo = s * kpb, hi = min(lo + kpb, tk);
  const T* qr = qkv + b * qkv_stride + (long)h * head_stride;
  const long head_off = ((long)b * nh + h) * t_max * HS;
  T* kr = kc + head_off;
  T* vr = vc + head_off;
  const float* mrow = key_mask + (long)b * t_max;
  const float* prow = key_pos + (long)b * t_max;
  const float slope = slopes ? slopes[h] : 0.f;
  SplitRound<T, HS> cur, next;
  if (lo < hi) load_round<T, HS>(cur, lo, hi, pos, kr, vr, qr, part, mrow, prow, slopes != nullptr);
  const Vec16<T> qv = reinterpret_cast<const Vec16<T>*>(qr)[gl];
  if (pos >= lo && pos < hi && threadIdx.x < 2 * G) {  // the new key and value into the cache
    const int t = threadIdx.x % G, which = threadIdx.x / G;
    const Vec16<T>* src = reinterpret_cast<const Vec16<T>*>(qr + (which + 1) * part);
    reinterpret_cast<Vec16<T>*>((which ? vr : kr) + (long)pos * HS)[t] = src[t];
  }
  float m = -INFINITY, l = 0.f, acc[EV];
#pragma unroll
  for (int e = 0; e < EV; ++e) acc[e] = 0.f;
  for (int base = lo; base < hi; base += KPR) {
    if (base + KPR < hi) load_round<T, HS>(next, base + KPR, hi, pos, kr, vr, qr, part, mrow, prow, slopes != nullptr);
    float sc[S::R], mx = m;
#pragma unroll
    for (int u = 0; u < S::R; ++u) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < EV; ++e) dot += to_f(qv.e[e]) * to_f(cur.k[u].e[e]);
#pragma unroll
      for (int o = G / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
      sc[u] = -INFINITY;
      if (round_key<T, HS>(base, u) < hi) sc[u] = to_f(from_f<T>(dot)) * scale + (1.f - cur.mask[u]) * MASKED + slope * cur.kpos[u];
      mx = fmaxf(mx, sc[u]);
    }
    if (mx != -INFINITY) {
      const float c = rescale(m, mx);
      l *= c;
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[e] *= c;
#pragma unroll
      for (int u = 0; u < S::R; ++u) {
        if (sc[u] == -INFINITY) continue;  // past the block's keys: its registers never loaded
        const float p = expf(sc[u] - mx);
        l += p;
#pragma unroll
        for (int e = 0; e < EV; ++e) acc[e] += p * to_f(cur.v[u].e[e]);
      }
      m = mx;
    }
    cur = next;
  }
  // The warp's groups (lanes gl, gl + G, ...) merged, then the warps in shared memory.
#pragma unroll
  for (int o = G; o < 32; o <<= 1) {
    const float mo = __shfl_xor_sync(0xffffffff, m, o), lo_ = __shfl_xor_sync(0xffffffff, l, o);
    const float mm = fmaxf(m, mo), ca = rescale(m, mm), cb = rescale(mo, mm);
    l = l * ca + lo_ * cb;
#pragma unroll
    for (int e = 0; e < EV; ++e) acc[e] = acc[e] * ca + __shfl_xor_sync(0xffffffff, acc[e], o) * cb;
    m = mm;
  }
  if (lane < G)
#pragma unroll
    for (int e = 0; e < EV; ++e) wacc[warp][gl * EV + e] = acc[e];
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  __syncthreads();
  float mm = -INFINITY;
#pragma unroll
  for (int w = 0; w < SPLIT_WARPS; ++w) mm = fmaxf(mm, wm[w]);
  const long o = (long)bh * gridDim.y + s;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < SPLIT_WARPS; ++w) {
      const float c = rescale(wm[w], mm);
      num += c * wacc[w][d];
      den += c * wl[w];
    }
    if (gridDim.y == 1) {
      out[(long)bh * HS + d] = from_f<T>(num / den);
    } else {
      part_acc[o * HS + d] = num;
      if (d == 0) {
        part_m[o] = mm;
        part_l[o] = den;
      }
    }
  }
}

// Merges a head's split blocks: out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s, M the
// largest m_s; one block (hs threads) per (row, head), heads merged on the way out.
//   out: (B, nh·hs)
template <typename T>
__device__ void decode_combine(const float* part_m, const float* part_l, const float* part_acc, T* out, int splits,
                               int hs) {
  const int bh = blockIdx.x;
  const float* m = part_m + (long)bh * splits;
  const float* l = part_l + (long)bh * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m[s]);
  float den = 0.f, num = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float w = m[s] == -INFINITY ? 0.f : expf(m[s] - mx);
    den += w * l[s];
    if (threadIdx.x < hs) num += w * part_acc[((long)bh * splits + s) * hs + threadIdx.x];
  }
  if (threadIdx.x < hs) out[(long)bh * hs + threadIdx.x] = from_f<T>(num / den);
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

// One kernel a head size, each with its own register allocation.
#define SPLIT_KERNEL(T, S, HS)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256, 2) tb_decode_attention_split##HS##_##S(                  \
      const T* qkv, long qkv_stride, int head_stride, int part, T* kc, T* vc, const float* key_mask,          \
      const float* slopes, const float* key_pos, float* part_m, float* part_l, float* part_acc, T* out,       \
      float scale, int nh, int t_max, int pos, const uint32_t* cursor, int kpb) {                             \
    decode_attention_split<T, HS>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos,      \
                                  part_m, part_l, part_acc, out, scale, nh, t_max, pos, cursor, kpb);         \
  }
#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_decode_attention_##S(const T* qkv, long qkv_stride, int head_stride, int part, \
                                                     T* kc, T* vc, const float* key_mask, const float* slopes, \
                                                     const float* key_pos, T* out, float scale, int nh, int hs, \
                                                     int t_max, int pos, const uint32_t* cursor) {            \
    decode_attention<T>(qkv, qkv_stride, head_stride, part, kc, vc, key_mask, slopes, key_pos, out, scale, nh, \
                        hs, t_max, pos, cursor);                                                              \
  }                                                                                                           \
  SPLIT_KERNEL(T, S, 64) SPLIT_KERNEL(T, S, 128)                                                              \
  extern "C" __global__ void tb_decode_combine_##S(const float* part_m, const float* part_l,                  \
                                                   const float* part_acc, T* out, int splits, int hs) {       \
    decode_combine<T>(part_m, part_l, part_acc, out, splits, hs);                                             \
  }
FOR_TYPES(INSTANTIATE)
