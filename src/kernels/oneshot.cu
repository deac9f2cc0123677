// One-shot sum over the GPUs of one host (#34): tensor parallelism's small all-reduces (a
// decode step's 60 sums of 8 KiB on bloom-7b1) cost NCCL ≈ 18 µs each, its latency floor. Here
// each rank pushes its values into every rank's receive buffer over NVLink (CUDA IPC, mapped
// by src/dist/peer_sum.rs) and sums the copies it receives in rank order, so every rank gets
// the same bits. One launch, no host, no barrier: each 16-byte line carries 8 bytes of values
// and the epoch twice (NCCL's LL protocol), so a receiver knows a line has arrived from the line
// itself (16-byte stores and loads are single copies), with no fence or flag round trip.
// Launched by oneshot.rs.
//
// Each rank's buffer (one cuMemAlloc, IPC-shared): COUNTERS [MAX_BLOCKS] u32 (this rank's epoch
// of each block; sender and receiver blocks of one index handle the same lines, and every
// rank's block b has run as often as the others'), then at DATA two slots (even and odd
// epochs) of [MAX_RANKS senders][2 · cap bytes of lines].
// Why two slots suffice without a barrier: a rank writing slot e % 2 at epoch e has received
// every rank's lines of epoch e − 1, which each rank sent after its epoch e − 2 had finished
// reading that slot (kernels of one stream run in order).
// Shapes: x, y (n,) contiguous, n · sizeof(T) whole 16-byte vectors, ≤ cap bytes.
#include "common.cuh"

#define MAX_RANKS 8
#define MAX_BLOCKS 32
#define COUNTERS 0
#define DATA 4096

// A line: two 4-byte words of values, each beside the epoch that sent it.
struct __align__(16) Line {
  uint32_t data1, flag1, data2, flag2;
};

__device__ __forceinline__ void store_line(Line* p, uint32_t d1, uint32_t d2, uint32_t epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(d1), "r"(epoch), "r"(d2),
               "r"(epoch)
               : "memory");
}

__device__ __forceinline__ Line load_line(const Line* p) {
  Line l;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(l.data1), "=r"(l.flag1), "=r"(l.data2), "=r"(l.flag2)
               : "l"(p)
               : "memory");
  return l;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The line of this epoch at `p`, once it has arrived. A rank that never sends (it died) would
// hang the stream: after 60 s the kernel traps, which fails the run with a CUDA error.
__device__ Line receive(const Line* p, uint32_t epoch, unsigned rank, unsigned from) {
  Line l = load_line(p);
  if (l.flag1 == epoch && l.flag2 == epoch) return l;
  const unsigned long long start = now_ns();
  for (;;) {
    l = load_line(p);
    if (l.flag1 == epoch && l.flag2 == epoch) return l;
    if (now_ns() - start > 60ull * 1000 * 1000 * 1000) {
      printf("one-shot sum: rank %u waited 60 s for rank %u (did it fail?)\n", rank, from);
      __trap();
    }
  }
}

// Adds the values of a 4-byte word to acc (4 / sizeof(T) of them).
template <typename T>
__device__ __forceinline__ void add_word(float* acc, uint32_t w) {
  constexpr int E = 4 / sizeof(T);
  const T* v = (const T*)&w;
#pragma unroll
  for (int j = 0; j < E; j++) acc[j] += to_f(v[j]);
}

template <typename T>
__device__ __forceinline__ uint32_t round_word(const float* acc) {
  constexpr int E = 4 / sizeof(T);
  uint32_t w;
  T* v = (T*)&w;
#pragma unroll
  for (int j = 0; j < E; j++) v[j] = from_f<T>(acc[j]);
  return w;
}

template <typename T>
__device__ void oneshot_sum(const uint2* x, uint2* y, long lines, const unsigned long long* bases, unsigned rank,
                            unsigned world, unsigned cap) {
  constexpr int E = 4 / sizeof(T);
  __shared__ uint32_t epoch_s;
  char* own = (char*)bases[rank];
  uint32_t* counter = (uint32_t*)(own + COUNTERS) + blockIdx.x;
  if (threadIdx.x == 0) epoch_s = *counter + 1;
  __syncthreads();
  const uint32_t epoch = epoch_s;
  const size_t run = 2 * (size_t)cap;  // a sender's lines in one slot
  const size_t slot = DATA + (size_t)(epoch & 1) * MAX_RANKS * run;
  // This block's lines: the same on every rank (same n, same grid).
  const long per = (lines + gridDim.x - 1) / gridDim.x;
  const long lo = blockIdx.x * per, hi = min(lines, lo + per);

  // Push: my 8 bytes of line i into my run of every rank's slot.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const uint2 v = x[i];
    for (unsigned r = 0; r < world; r++) {
      Line* dst = (Line*)((char*)bases[r] + slot + rank * run) + i;
      store_line(dst, v.x, v.y, epoch);
    }
  }
  // Receive and sum, in rank order, f32 inside, one rounding.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float a1[E], a2[E];
#pragma unroll
    for (int j = 0; j < E; j++) a1[j] = a2[j] = 0.f;
    for (unsigned r = 0; r < world; r++) {
      const Line l = receive((const Line*)(own + slot + r * run) + i, epoch, rank, r);
      add_word<T>(a1, l.data1);
      add_word<T>(a2, l.data2);
    }
    y[i] = make_uint2(round_word<T>(a1), round_word<T>(a2));
  }
  __syncthreads();
  if (threadIdx.x == 0) *counter = epoch;
}

#define INSTANTIATE(T, S)                                                                                  \
  extern "C" __global__ void tb_oneshot_sum_##S(const uint2* x, uint2* y, long lines,                    \
                                                const unsigned long long* bases, unsigned rank,            \
                                                unsigned world, unsigned cap) {                            \
    oneshot_sum<T>(x, y, lines, bases, rank, world, cap);                                                  \
  }
FOR_TYPES(INSTANTIATE)
