// The dropout keep-mask seen from a kernel, shared by dropout.cu, attn_softmax.cu and
// flash_attn.cu.
#pragma once
#include "common.cuh"

// Dropout without a stored mask: element i of a tensor gets a 16-bit uniform, half of a
// 32-bit keyed hash of the pair i / 2 (murmur3's finalizer over the pair index mixed with the
// key), and is kept when that uniform is at least thresh = p·2¹⁶, as torch draws it with
// Philox from (seed, offset). The backward redraws the same bits from the same key, so no
// mask is written. 32-bit arithmetic and one hash for two neighbours: the fused attention
// draws a mask element for every score two or three times a step (forward, and each backward
// kernel: dk/dv, and dq where dq has its own), where a 64-bit hash an element cost ≈ 28
// integer operations.

// The word of a pair index below 2³² from the key's halves: the flash kernels' form.
__device__ __forceinline__ unsigned int keep_word32(unsigned int klo, unsigned int khi, unsigned int pair) {
  unsigned int h = (pair ^ klo) * 0x9E3779B1u + khi;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}
__device__ __forceinline__ unsigned int keep_word(unsigned long long key, unsigned long long pair) {
  const unsigned int hi = (unsigned int)(pair >> 32);
  return keep_word32((unsigned int)key, (unsigned int)(key >> 32) ^ hi * 0x85EBCA77u, (unsigned int)pair);
}
// Element i's uniform: the low half of its pair's word for even i, the high half for odd.
__device__ __forceinline__ unsigned int keep_u16(unsigned int word, unsigned long long i) {
  return (i & 1ull) ? word >> 16 : word & 0xffffu;
}
__device__ __forceinline__ bool keep_bit(unsigned long long key, unsigned long long i, unsigned int thresh) {
  return keep_u16(keep_word(key, i >> 1), i) >= thresh;
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
