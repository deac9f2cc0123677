// Token-embedding backward (#21); launched by embedding.rs.
// Shapes: ids (N,) u32; demb (N, C) f32; out (V, C) f32, a copy of the gradient it adds to.
#include "common.cuh"

// out[ids[i], :] += demb[i, :] for every token row i, one block a row (grid-strided), f32
// atomics: a token that repeats adds its rows in no fixed order (as torch's index_add_ on
// CUDA). candle's index_add walked the rows one after another: 4.2 ms for gpt2's 8192 tokens.
// Ids at or beyond V are skipped (the caller checks them).
extern "C" __global__ void tb_embedding_bwd(const unsigned int* ids, const float* demb, float* out, long rows,
                                            int c, long vocab) {
  for (long i = blockIdx.x; i < rows; i += gridDim.x) {
    const long id = ids[i];
    if (id >= vocab) continue;
    for (int k = threadIdx.x; k < c; k += blockDim.x) atomicAdd(&out[id * c + k], demb[i * c + k]);
  }
}
