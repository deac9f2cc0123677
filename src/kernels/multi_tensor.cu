// The optimizer over many tensors per launch (#21 item 3), launched by multi_tensor.rs: the
// gradient norm's Σ g², torch clip_grad_norm_'s factor computed on the device, and AdamW.
// A launch takes up to MT_MAX tensors by value (device pointers and sizes); each block works on
// CHUNK elements of one tensor, which it finds from block0 (the first block of each tensor).
// Shapes: param (n_i,) storage type T, grad (n_i,) T or narrower; mv (2, n_i) f32 (first, second moment);
// copy (n_i,) bf16 / f16 or absent (null); partials (blocks,) f32; clip (2,) f32 = (norm, factor).
#include "common.cuh"

#define MT_MAX 36
#define CHUNK 16384

// Layout shared with multi_tensor.rs (`MtTensors`, #[repr(C)]).
struct MtTensors {
  unsigned long long param[MT_MAX];
  unsigned long long grad[MT_MAX];
  unsigned long long mv[MT_MAX];
  unsigned long long copy[MT_MAX];
  long long n[MT_MAX];
  int block0[MT_MAX + 1];
  int count;
};

// Four consecutive elements, loaded or stored as one access (16 bytes of f32, 8 of bf16 / f16):
// the optimizer's passes are bound by memory, and a 4-byte access a thread left them at
// ≈ 2.0–2.5 TB/s (results/h100/train-prof2).
template <typename T> struct alignas(4 * sizeof(T)) V4 { T e[4]; };
template <typename T> __device__ __forceinline__ bool aligned4(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0;
}

// This block's tensor, and the first element of its chunk.
__device__ __forceinline__ int mt_locate(const MtTensors& t, long long* start) {
  int i = 0;
  while (i + 1 < t.count && (int)blockIdx.x >= t.block0[i + 1]) i++;
  *start = (long long)(blockIdx.x - t.block0[i]) * CHUNK;
  return i;
}

// partials[block] = Σ g² over the block's chunk: no atomics, so the sum's order is fixed.
template <typename T>
__device__ void mt_sum_squares(const MtTensors& t, float* partials) {
  __shared__ float sh[32];
  long long start;
  const int i = mt_locate(t, &start);
  const T* g = (const T*)t.grad[i];
  const long long end = min(start + CHUNK, t.n[i]);
  float s = 0.f;
  if (t.n[i] % 4 == 0 && aligned4<T>(g)) {  // chunks of CHUNK: every start a multiple of 4
    for (long long j = start + 4 * threadIdx.x; j < end; j += 4 * blockDim.x) {
      const V4<T> v = *reinterpret_cast<const V4<T>*>(g + j);
#pragma unroll
      for (int e = 0; e < 4; e++) s += to_f(v.e[e]) * to_f(v.e[e]);
    }
  } else {
    for (long long j = start + threadIdx.x; j < end; j += blockDim.x) {
      const float v = to_f(g[j]);
      s += v * v;
    }
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// AdamW in place, torch's single-tensor order (train::AdamW), every gradient times
// gscale · clip[1]: m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²;
// p ← p·decay − step_size · m / (√v / bc2_sqrt + ε).
// The gradient may be stored narrower than the parameter (bf16 gradients of f32 masters: the
// cast to f32 was a pass of its own). Where t.copy[i] is set, the updated parameter is also
// written there in C, rounded as mt_cast rounds it: the next step's compute copy of an f32
// master, without a cast pass that reads the masters again (#36).
template <typename T, typename G, typename C>
__device__ void mt_adamw(const MtTensors& t, const float* clip, float gscale, float beta1, float beta2,
                         float decay, float step_size, float bc2_sqrt, float eps) {
  long long start;
  const int i = mt_locate(t, &start);
  T* p = (T*)t.param[i];
  const G* g = (const G*)t.grad[i];
  C* cp = (C*)t.copy[i];
  const long long n = t.n[i], end = min(start + CHUNK, n);
  float* m = (float*)t.mv[i];
  float* v = m + n;
  const float k = gscale * clip[1];
  // One element: m, v and the parameter updated from gradient gj (unscaled).
  auto update = [&](float pj, float gj, float& mj, float& vj) {
    gj *= k;
    mj = mj + (1.f - beta1) * (gj - mj);  // torch's lerp form
    vj = beta2 * vj + (1.f - beta2) * gj * gj;
    return pj * decay - step_size * mj / (sqrtf(vj) / bc2_sqrt + eps);
  };
  // v = m + n is aligned with m.
  if (n % 4 == 0 && aligned4<T>(p) && aligned4<G>(g) && aligned4<float>(m) && aligned4<C>(cp)) {
    for (long long j = start + 4 * threadIdx.x; j < end; j += 4 * blockDim.x) {
      V4<T> pv = *reinterpret_cast<const V4<T>*>(p + j);
      const V4<G> gv = *reinterpret_cast<const V4<G>*>(g + j);
      V4<float> mv = *reinterpret_cast<const V4<float>*>(m + j), vv = *reinterpret_cast<const V4<float>*>(v + j);
#pragma unroll
      for (int e = 0; e < 4; e++) pv.e[e] = from_f<T>(update(to_f(pv.e[e]), to_f(gv.e[e]), mv.e[e], vv.e[e]));
      *reinterpret_cast<V4<float>*>(m + j) = mv;
      *reinterpret_cast<V4<float>*>(v + j) = vv;
      *reinterpret_cast<V4<T>*>(p + j) = pv;
      if (cp) {
        V4<C> cv;
#pragma unroll
        for (int e = 0; e < 4; e++) cv.e[e] = from_f<C>(to_f(pv.e[e]));
        *reinterpret_cast<V4<C>*>(cp + j) = cv;
      }
    }
    return;
  }
  for (long long j = start + threadIdx.x; j < end; j += blockDim.x) {
    float mj = m[j], vj = v[j];
    p[j] = from_f<T>(update(to_f(p[j]), to_f(g[j]), mj, vj));
    m[j] = mj;
    v[j] = vj;
    if (cp) cp[j] = from_f<C>(to_f(p[j]));
  }
}

// One block: the partials summed in a fixed order; clip = (norm, factor) with norm = √Σ / loss
// scale (the unscaled gradients' norm) and factor = min(1, max_norm / (norm + 1e-6)) / loss
// scale (no clipping when max_norm ≤ 0, as HF Trainer).
extern "C" __global__ void tb_mt_clip(const float* partials, int n, float* clip, float loss_scale,
                                      float max_norm) {
  __shared__ float sh[32];
  float s = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += partials[j];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) {
    const float norm = sqrtf(s) / loss_scale;
    const float factor = max_norm > 0.f ? fminf(1.f, max_norm / (norm + 1e-6f)) : 1.f;
    clip[0] = norm;
    clip[1] = factor / loss_scale;
  }
}

// dst = src in another float type, many tensors a launch: the training step's compute-dtype
// copies of the f32 masters (one launch per 36 tensors instead of one cast each), data
// parallelism's f32 buckets of the gradients. src in the table's grad slots, dst in its param
// slots.
template <typename S, typename D>
__device__ void mt_cast(const MtTensors& t) {
  long long start;
  const int i = mt_locate(t, &start);
  const S* src = (const S*)t.grad[i];
  D* dst = (D*)t.param[i];
  const long long end = min(start + CHUNK, t.n[i]);
  if (t.n[i] % 4 == 0 && aligned4<S>(src) && aligned4<D>(dst)) {
    for (long long j = start + 4 * threadIdx.x; j < end; j += 4 * blockDim.x) {
      const V4<S> a = *reinterpret_cast<const V4<S>*>(src + j);
      V4<D> b;
#pragma unroll
      for (int e = 0; e < 4; e++) b.e[e] = from_f<D>(to_f(a.e[e]));
      *reinterpret_cast<V4<D>*>(dst + j) = b;
    }
    return;
  }
  for (long long j = start + threadIdx.x; j < end; j += blockDim.x) dst[j] = from_f<D>(to_f(src[j]));
}
// tb_mt_cast_SRC_DST for every pair of float types (data parallelism's gradient buckets cast
// bf16 gradients into f32 in the same pass).
#define CAST(S, SN, D, DN)                                                             \
  extern "C" __global__ void tb_mt_cast_##SN##_##DN(const __grid_constant__ MtTensors t) { \
    mt_cast<S, D>(t);                                                                  \
  }
#define CASTS_FROM(S, SN) CAST(S, SN, float, f32) CAST(S, SN, __nv_bfloat16, bf16) CAST(S, SN, __half, f16)
FOR_TYPES(CASTS_FROM)

#define INSTANTIATE(T, S)                                                                                \
  extern "C" __global__ void tb_mt_sum_squares_##S(const __grid_constant__ MtTensors t, float* partials) { \
    mt_sum_squares<T>(t, partials);                                                                      \
  }
FOR_TYPES(INSTANTIATE)

// tb_mt_adamw_<param type>_<gradient type>, every pair (copy slots ignored: null).
#define ADAMW(T, S, G, SG, C, NAME)                                                                       \
  extern "C" __global__ void NAME(const __grid_constant__ MtTensors t, const float* clip, float gscale,   \
                                  float beta1, float beta2, float decay, float step_size, float bc2_sqrt, \
                                  float eps) {                                                            \
    mt_adamw<T, G, C>(t, clip, gscale, beta1, beta2, decay, step_size, bc2_sqrt, eps);                   \
  }
#define INSTANTIATE_ADAMW(T, S, G, SG) ADAMW(T, S, G, SG, T, tb_mt_adamw_##S##_##SG)
#define FOR_GRADS(T, S)                        \
  INSTANTIATE_ADAMW(T, S, float, f32)          \
  INSTANTIATE_ADAMW(T, S, __nv_bfloat16, bf16) \
  INSTANTIATE_ADAMW(T, S, __half, f16)
FOR_TYPES(FOR_GRADS)
// tb_mt_adamw_copy_f32_<gradient type>_<copy type>: f32 masters writing bf16 / f16 copies.
#define ADAMW_COPY(G, SG)                                                            \
  ADAMW(float, f32, G, SG, __nv_bfloat16, tb_mt_adamw_copy_f32_##SG##_bf16) \
  ADAMW(float, f32, G, SG, __half, tb_mt_adamw_copy_f32_##SG##_f16)
FOR_TYPES(ADAMW_COPY)
