// The dropout keep-mask seen from a kernel, shared by dropout.cu and attn_softmax.cu.
#pragma once
#include "common.cuh"

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
