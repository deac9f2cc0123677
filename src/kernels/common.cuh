// Shared device helpers of the fused kernels (#10), included by every <family>.cu (one file a
// kernel family, each compiled to its own PTX by build.rs with `--features cuda`). Each kernel
// replaces a chain of candle ops that each read and wrote the whole tensor; the arithmetic is
// the same (f32 inside, one rounding to the storage type at the end).
// Names end in the storage type: _f32, _bf16, _f16 (candle's kernel_name convention);
// FOR_TYPES instantiates a family's extern "C" kernels once per storage type.
#pragma once
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

// GELU, tanh approximation (gelu_new, bloom_gelu; cuBLASLt's GELU epilogue).
__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

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

// A 16-byte vector of storage type T (8 bf16 / f16, 4 f32): one load or store a thread.
template <typename T> struct alignas(16) Vec16 { T e[16 / sizeof(T)]; };

// M(T, S) for each storage type T with its kernel-name suffix S.
#define FOR_TYPES(M) M(float, f32) M(__nv_bfloat16, bf16) M(__half, f16)

// Programmatic dependent launch (`--fused pdl`, src/kernels/pdl.rs): a decode graph's edge into a
// kernel that calls this first may let the kernel's blocks start while the kernel before it
// still runs. The wait holds every block until that kernel has finished and its writes are
// visible, so nothing after it (every load and store of the kernel) can race; the trigger then
// lets the next kernel's blocks start the same way. Both are no-ops in a kernel launched the
// usual way. Every kernel that calls it calls it first, in every block, before any memory
// access: pdl.rs's list of such kernels relies on that (a GPU test reads their PTX).
__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// pdl_begin_trigger_first in two halves, for the kernels that load their weights between them
// (gemv.cu's wide GEMVs): the trigger lets the next kernel launch while this one still loads
// and waits, so that each such kernel starts a stage or more ahead of its input.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// pdl_begin with the trigger first (`--fused trigger-first`): the next kernel's blocks may be
// launched while this one still waits for the kernel before it, and load what they read before
// their own wait (the fp8 GEMVs' weights, fp8.cu's EARLY) under this kernel. For the one-wave
// kernels that come before a GEMV (the norms, the attention's merge). The next kernel's wait is
// for this kernel's end, which comes after this wait, so nothing it reads can race either.
__device__ __forceinline__ void pdl_begin_trigger_first() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
