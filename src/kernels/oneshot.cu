// One-shot sum over the GPUs of one host (#34): tensor parallelism's small all-reduces (a
// decode step's 60 sums of 8 KiB on bloom-7b1) cost NCCL ≈ 18 µs each, its latency floor. Here
// each rank pushes its values into every rank's receive buffer over NVLink (CUDA IPC, mapped
// by src/dist/peer_sum.rs), raises a flag in each, waits for every rank's flag and sums the
// copies it received in rank order, so every rank gets the same bits. One launch, no host.
// Launched by oneshot.rs.
//
// Each rank's buffer (one cuMemAlloc, IPC-shared): FLAGS [MAX_BLOCKS][MAX_RANKS] u32 epochs
// the senders raise, COUNTERS [MAX_BLOCKS] u32 (this rank's epoch of each block), then at
// DATA two slots (even and odd epochs) of [MAX_RANKS senders][cap bytes].
// Why two slots and one barrier suffice: a rank writing slot e % 2 at epoch e has seen every
// rank's flag e - 1, so every rank has finished epoch e - 2, the last reader of that slot.
// Shapes: x, y (n,) contiguous, n · sizeof(T) whole 16-byte vectors, ≤ cap bytes.
#include "common.cuh"

#define MAX_RANKS 8
#define MAX_BLOCKS 32
#define FLAGS 0
#define COUNTERS (MAX_BLOCKS * MAX_RANKS * 4)
#define DATA 4096

__device__ __forceinline__ void store_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread `from` of each block waits for rank `from`'s flag of this epoch (or a later one: a
// faster rank may already have raised the next). A rank that never comes (it died) would
// hang the stream: after 60 s the kernel traps, which fails the run with a CUDA error.
__device__ void wait_flag(const unsigned* flag, unsigned epoch, unsigned rank, unsigned from) {
  const unsigned long long start = now_ns();
  while ((int)(load_acquire_sys(flag) - epoch) < 0) {
    if (now_ns() - start > 60ull * 1000 * 1000 * 1000) {
      printf("one-shot sum: rank %u waited 60 s for rank %u (did it fail?)\n", rank, from);
      __trap();
    }
  }
}

template <typename T>
__device__ void oneshot_sum(const Vec16<T>* x, Vec16<T>* y, long vectors, const unsigned long long* bases,
                            unsigned rank, unsigned world, unsigned cap) {
  constexpr int E = 16 / sizeof(T);
  __shared__ unsigned epoch_s;
  char* own = (char*)bases[rank];
  unsigned* counter = (unsigned*)(own + COUNTERS) + blockIdx.x;
  if (threadIdx.x == 0) epoch_s = *counter + 1;
  __syncthreads();
  const unsigned epoch = epoch_s;
  const size_t slot = DATA + (size_t)(epoch & 1) * MAX_RANKS * cap;
  // This block's run of vectors: the same on every rank (same n, same grid).
  const long per = (vectors + gridDim.x - 1) / gridDim.x;
  const long lo = blockIdx.x * per, hi = min(vectors, lo + per);

  // 1. Push: my values into my place in every rank's slot.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const Vec16<T> v = x[i];
    for (unsigned r = 0; r < world; r++) ((Vec16<T>*)((char*)bases[r] + slot + (size_t)rank * cap))[i] = v;
  }
  __threadfence_system();
  __syncthreads();

  // 2. Flag every rank (thread r raises mine in rank r's buffer), wait for every rank's flag.
  if (threadIdx.x < world) {
    unsigned* theirs = (unsigned*)((char*)bases[threadIdx.x] + FLAGS) + blockIdx.x * MAX_RANKS + rank;
    store_release_sys(theirs, epoch);
    const unsigned* mine = (const unsigned*)(own + FLAGS) + blockIdx.x * MAX_RANKS + threadIdx.x;
    wait_flag(mine, epoch, rank, threadIdx.x);
  }
  __syncthreads();

  // 3. Sum the received copies in rank order, f32 inside, one rounding. L2 loads (__ldcg):
  // the peers wrote this memory, which L1 does not see.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float acc[E];
#pragma unroll
    for (int j = 0; j < E; j++) acc[j] = 0.f;
    for (unsigned r = 0; r < world; r++) {
      const uint4 raw = __ldcg((const uint4*)(own + slot + (size_t)r * cap) + i);
      const Vec16<T> v = *(const Vec16<T>*)&raw;
#pragma unroll
      for (int j = 0; j < E; j++) acc[j] += to_f(v.e[j]);
    }
    Vec16<T> s;
#pragma unroll
    for (int j = 0; j < E; j++) s.e[j] = from_f<T>(acc[j]);
    y[i] = s;
  }
  if (threadIdx.x == 0) *counter = epoch;
}

#define INSTANTIATE(T, S)                                                                            \
  extern "C" __global__ void tb_oneshot_sum_##S(const Vec16<T>* x, Vec16<T>* y, long vectors,      \
                                                const unsigned long long* bases, unsigned rank,      \
                                                unsigned world, unsigned cap) {                      \
    oneshot_sum<T>(x, y, vectors, bases, rank, world, cap);                                          \
  }
FOR_TYPES(INSTANTIATE)
