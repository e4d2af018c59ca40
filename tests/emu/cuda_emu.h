// A CPU emulator of the project's CUDA kernels, for tests (no GPU needed): a kernel file compiled by the host
// compiler with -DLLMT_CUDA_EMU -include tests/emu/cuda_emu.h runs its kernels here, launched by its own host
// launchers (tile::launch calls emu::launch under LLMT_CUDA_EMU; a file's own chevron launches, in the copy that
// tests/CMakeLists.txt compiles, go through Chevrons below); tests/emu/cuda_emu_runtime.cpp stands in for libcudart. docs/ARCHITECTURE.md (Verification) says how the test uses it and what it catches.
//
// What it models:
//   - A launch runs at its call, block after block (x fastest, then y, z): one block at a time, never two
//     concurrently; blocks of whole warps, at most 512 threads, one-dimensional (every kernel it runs).
//   - A block's threads are fibers (ucontext) on the calling OS thread, switched cooperatively at the
//     scheduling points: __syncthreads and the warp collectives (ldmatrix.x4 [.trans], mma.sync m16n8k16 bf16,
//     __shfl_xor_sync, __shfl_up_sync, __reduce_max_sync), which complete when all 32 lanes of the warp have reached
//     them (the same collective, full mask, width 32; anything else aborts). Between two scheduling points a thread
//     runs alone, so the order in which threads reach them decides every race; `config.schedule` picks that order:
//       round_robin     threads 0, 1, ... in turn, each to its next scheduling point, warps' collectives in between;
//       warps_forward   warp by warp (0, 1, ...), each warp run to its next barrier before the next one starts
//                       (lanes 0 .. 31 in turn between its collectives);
//       warps_reverse   as warps_forward with the warps in reverse and lanes 31 .. 0;
//       warps_shuffled  as warps_forward in a fresh random warp order per barrier interval (config.seed).
//     A kernel without races gives the same bits under every schedule; a missing barrier or a read of another
//     thread's or warp's writes before the barrier that orders them gives schedule-dependent results.
//   - cp.async (16 bytes with zero fill, 4 bytes): the source is read at issue; `config.cp_async` picks when the
//     bytes land in shared memory: at_issue (at once) or at_wait (only when the thread's cp_async_wait<N> retires
//     their committed group; copies never waited for never land). A missing or too weak wait, or a read of another
//     thread's copies without a barrier after its wait, gives results that differ between the two modes.
//   - Dynamic shared memory is filled with 0xff bytes (NaN as fp32 and as bf16) before every block, so a read of
//     an element no thread wrote propagates NaN; cp.async destinations and ldmatrix rows must lie inside the
//     launch's dynamic shared memory, 16-byte aligned (checked).
//   - tile::Tc's WMMA product (delta_tile.cuh; the GDN / Comba bf16 scans at key_dim > 256): under LLMT_CUDA_EMU
//     the product between its two barriers is scalar code instead (each lane of a warp computes 16 elements of the
//     warp's 16 x 32 block from the same bf16 operand tiles, exact products summed in depth order in fp32; no warp
//     collective, so no WMMA fragment layout is checked).
//   - mma.sync: D = A B + C with the products of the bf16 operands (exact in fp32) added to C in depth order in fp32;
//     the tensor cores' own accumulation order and rounding are not the hardware's, so results are close to the
//     GPU's, not bit-identical to them. The fp32 intrinsics (__fadd_rn, __fmul_rn, __fma_rn, __dadd_rn) are exact
//     IEEE operations (__fdividef too: the exact quotient, where the GPU's is within 2 ulp); build the kernel TU with
//     -ffp-contract=off (the GPU contracts a * b + c into fma where the source does not prevent it: plain fp32
//     expressions can differ from the GPU's in the last bit).
//   - The host runtime (cuda_emu_runtime.cpp): one device with 132 SMs (an H100 / H200), 227 KiB of shared
//     memory per block, occupancy from the dynamic shared memory and the thread count only (no register limit),
//     static shared memory of a kernel reported as 0; streams and events are handles without work: launches run
//     at their call, in issue order, which is the order of a single stream and satisfies every fork / join.
//     Device pointers are host pointers.
// What it does not model: performance or timing of any kind; real concurrency (between blocks, between threads
// between two scheduling points, memory-model reorderings, atomics); L1 / L2 / prefetch (no-ops); hardware-specific
// behaviour (bank conflicts, register limits, spills, the tensor cores' rounding, __launch_bounds__); WMMA
// itself (see tile::Tc above); kernels with other block sizes or partial-warp masks. Static __shared__ arrays become
// static (thread_local) variables shared by the threads of every block, not NaN-filled.
//
// A kernel file opts in with, at the namespace of its kernels (a block-scope `extern __shared__ char smem[]` names a
// variable of the innermost enclosing namespace):
//   #ifdef LLMT_CUDA_EMU
//   LLMT_CUDA_EMU_DYNAMIC_SMEM(smem);
//   #endif
// one line per name its kernels give the dynamic shared memory; LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(float, name) where they
// declare it as `extern __shared__ float name[]` (an element type other than char).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

namespace emu {

constexpr int kMaxThreads = 512;  // per block
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr size_t kMaxDynamicSmem = 227 * 1024;  // per block (sm_90)

enum class Schedule { round_robin, warps_forward, warps_reverse, warps_shuffled };
enum class CpAsync { at_issue, at_wait };
struct Config {
  Schedule schedule = Schedule::round_robin;
  CpAsync cp_async = CpAsync::at_issue;
  uint32_t seed = 1;  // warps_shuffled: the n-th block run by the process draws its warp orders from seed + n
};
/// What the next launches use (set it between launches).
inline Config config;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// ---- threads (fibers) ----

enum class State { run, barrier, warp, done };
enum class Collective { none, ldsm, ldsm_trans, mma, shfl_xor, shfl_up, reduce_max };
struct Copy {  // one cp.async: `size` bytes into dst (the source's first bytes, the rest zero)
  void* dst;
  int size;
  unsigned char data[16];
};
struct Thread {
  ucontext_t ctx;
  uint3 tid;
  State state = State::run;
  Collective op = Collective::none;
  const void* addr = nullptr;  // ldsm: this lane's row
  uint32_t r[4];               // ldsm result / mma A
  uint32_t b[2];               // mma B
  float d[4];                  // mma C / D
  uint64_t value;              // shfl / reduce: this lane's operand, then its result
  int src_lane;                // shfl: the lane whose operand this lane receives
  std::vector<std::vector<Copy>> groups;  // committed cp.async groups, oldest first (at_wait)
  std::vector<Copy> open;                 // copies since the last commit (at_wait)
  char* stack = nullptr;
};

struct Block {
  Thread threads[kMaxThreads];
  int nthreads = 0;  // the launch's (a multiple of 32)
  Thread* cur = nullptr;
  ucontext_t sched;
  uint3 idx{0, 0, 0};
  dim3 grid{1, 1, 1};
  dim3 dim{0, 1, 1};  // the launch's block size
  std::function<void()> body;
  std::vector<char*> smem;  // the dynamic shared memory arrays (one per name a kernel file declares)
  size_t smem_bytes = 0;     // the launch's
  uint64_t blocks_run = 0;
};
inline Block block;

/// The dynamic shared memory arrays of the kernel files (LLMT_CUDA_EMU_DYNAMIC_SMEM), each as a function returning
/// the calling OS thread's (registered during static initialisation, hence a function-local static).
inline std::vector<char* (*)()>& smem_arrays() {
  static std::vector<char* (*)()> arrays;
  return arrays;
}
inline bool register_smem(char* (*array)()) {
  if (array != nullptr) smem_arrays().push_back(array);
  return true;
}

inline Thread& self() { return *block.cur; }
inline void yield() { swapcontext(&block.cur->ctx, &block.sched); }

inline void syncthreads() {
  self().state = State::barrier;
  yield();
}

/// Whether bytes at p lie inside the launch's dynamic shared memory.
inline bool in_smem(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (const char* s : block.smem)
    if (c >= s && c + bytes <= s + block.smem_bytes) return true;
  return false;
}

// ---- cp.async ----

inline void cp_async(void* dst, const void* src, int size, int bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % size != 0 || (bytes > 0 && reinterpret_cast<uintptr_t>(src) % size != 0))
    fail("cp.async: misaligned source or destination");
  if (!in_smem(dst, size)) fail("cp.async: destination outside the launch's dynamic shared memory");
  if (bytes < 0 || bytes > size) fail("cp.async: bad source size");
  Copy c{dst, size, {}};
  if (bytes > 0) std::memcpy(c.data, src, bytes);  // the rest stays zero
  if (config.cp_async == CpAsync::at_issue) std::memcpy(dst, c.data, size);
  else self().open.push_back(c);
}
inline void cp_async_commit() {
  Thread& t = self();
  t.groups.push_back(std::move(t.open));
  t.open.clear();
}
inline void cp_async_wait(int pending) {
  Thread& t = self();
  while (static_cast<int>(t.groups.size()) > pending) {
    for (const Copy& c : t.groups.front()) std::memcpy(c.dst, c.data, c.size);
    t.groups.erase(t.groups.begin());
  }
}

// ---- warp collectives ----

inline void collective(Collective op) {
  self().state = State::warp;
  self().op = op;
  yield();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p, bool trans) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || !in_smem(p, 16))
    fail("ldmatrix: row address misaligned or outside the launch's dynamic shared memory");
  self().addr = p;
  collective(trans ? Collective::ldsm_trans : Collective::ldsm);
  for (int j = 0; j < 4; ++j) r[j] = self().r[j];
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Thread& t = self();
  for (int j = 0; j < 4; ++j) t.r[j] = a[j], t.d[j] = d[j];
  t.b[0] = b0, t.b[1] = b1;
  collective(Collective::mma);
  for (int j = 0; j < 4; ++j) d[j] = self().d[j];
}
inline void check_mask(unsigned mask) {
  if (mask != 0xffffffffu) fail("warp collective with a partial mask (not emulated)");
}
/// A shuffle: this lane receives lane src's v (op: which shuffle, so that all 32 lanes are checked to run the same).
template <typename T>
T shfl(unsigned mask, T v, int src, Collective op) {
  static_assert(sizeof(T) <= 8, "shfl of a value larger than 8 bytes");
  check_mask(mask);
  Thread& t = self();
  t.value = 0;
  std::memcpy(&t.value, &v, sizeof(T));
  t.src_lane = src;
  collective(op);
  std::memcpy(&v, &self().value, sizeof(T));
  return v;
}
template <typename T>
T shfl_xor(unsigned mask, T v, int lane_mask, int width) {
  if (width != 32) fail("__shfl_xor_sync with width != 32 (not emulated)");
  const int lane = static_cast<int>(self().tid.x % 32);
  return shfl(mask, v, (lane ^ lane_mask) & 31, Collective::shfl_xor);
}
/// Lanes below delta keep their own value (as on the GPU: no source lane below the warp's first).
template <typename T>
T shfl_up(unsigned mask, T v, unsigned delta, int width) {
  if (width != 32) fail("__shfl_up_sync with width != 32 (not emulated)");
  const int lane = static_cast<int>(self().tid.x % 32), d = static_cast<int>(delta);
  return shfl(mask, v, lane >= d ? lane - d : lane, Collective::shfl_up);
}
template <typename T>
T reduce_max(unsigned mask, T v) {
  check_mask(mask);
  self().value = static_cast<uint64_t>(static_cast<int64_t>(v));
  collective(Collective::reduce_max);
  return static_cast<T>(static_cast<int64_t>(self().value));
}

inline uint16_t bits(const __nv_bfloat16& x) {
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
inline float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_lo(uint32_t x) { return as_float(x << 16); }
inline float bf16_hi(uint32_t x) { return as_float(x & 0xffff0000u); }

/// Completes the collective that all 32 lanes of warp w have reached (bf16_mma.cuh gives the layouts).
inline void complete(Thread* w) {
  const Collective op = w[0].op;
  for (int l = 0; l < 32; ++l)
    if (w[l].op != op) fail("the lanes of a warp reached different collectives");
  if (op == Collective::ldsm || op == Collective::ldsm_trans) {
    uint32_t out[32][4];
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 4; ++j) {  // matrix j: rows at the addresses of lanes 8j .. 8j+7
        uint16_t lo, hi;
        if (op == Collective::ldsm) {  // row l/4, columns 2(l%4), 2(l%4)+1
          const auto* row = static_cast<const __nv_bfloat16*>(w[8 * j + l / 4].addr);
          lo = bits(row[2 * (l % 4)]), hi = bits(row[2 * (l % 4) + 1]);
        } else {  // rows 2(l%4), 2(l%4)+1 of column l/4
          const auto* r0 = static_cast<const __nv_bfloat16*>(w[8 * j + 2 * (l % 4)].addr);
          const auto* r1 = static_cast<const __nv_bfloat16*>(w[8 * j + 2 * (l % 4) + 1].addr);
          lo = bits(r0[l / 4]), hi = bits(r1[l / 4]);
        }
        out[l][j] = lo | (static_cast<uint32_t>(hi) << 16);
      }
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 4; ++j) w[l].r[j] = out[l][j];
  } else if (op == Collective::mma) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const Thread& x = w[l];
      A[g][2 * t] = bf16_lo(x.r[0]), A[g][2 * t + 1] = bf16_hi(x.r[0]);
      A[g + 8][2 * t] = bf16_lo(x.r[1]), A[g + 8][2 * t + 1] = bf16_hi(x.r[1]);
      A[g][2 * t + 8] = bf16_lo(x.r[2]), A[g][2 * t + 9] = bf16_hi(x.r[2]);
      A[g + 8][2 * t + 8] = bf16_lo(x.r[3]), A[g + 8][2 * t + 9] = bf16_hi(x.r[3]);
      B[2 * t][g] = bf16_lo(x.b[0]), B[2 * t + 1][g] = bf16_hi(x.b[0]);
      B[2 * t + 8][g] = bf16_lo(x.b[1]), B[2 * t + 9][g] = bf16_hi(x.b[1]);
      C[g][2 * t] = x.d[0], C[g][2 * t + 1] = x.d[1], C[g + 8][2 * t] = x.d[2], C[g + 8][2 * t + 1] = x.d[3];
    }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 16; ++k) C[r][c] += A[r][k] * B[k][c];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      Thread& x = w[l];
      x.d[0] = C[g][2 * t], x.d[1] = C[g][2 * t + 1], x.d[2] = C[g + 8][2 * t], x.d[3] = C[g + 8][2 * t + 1];
    }
  } else if (op == Collective::shfl_xor || op == Collective::shfl_up) {
    uint64_t in[32];
    for (int l = 0; l < 32; ++l) in[l] = w[l].value;
    for (int l = 0; l < 32; ++l) w[l].value = in[w[l].src_lane];
  } else if (op == Collective::reduce_max) {
    int64_t m = static_cast<int64_t>(w[0].value);
    for (int l = 1; l < 32; ++l) m = std::max(m, static_cast<int64_t>(w[l].value));
    for (int l = 0; l < 32; ++l) w[l].value = static_cast<uint64_t>(m);
  }
  for (int l = 0; l < 32; ++l) w[l].state = State::run, w[l].op = Collective::none;
}

// ---- blocks and launches ----

inline void thread_main() {
  block.body();
  Thread& t = self();
  t.state = State::done;
  t.open.clear();  // copies never waited for never land
  t.groups.clear();
  swapcontext(&t.ctx, &block.sched);
}

/// Runs thread t to its next scheduling point; whether it was runnable.
inline bool step(int t) {
  Thread& th = block.threads[t];
  if (th.state != State::run) return false;
  block.cur = &th;
  swapcontext(&block.sched, &th.ctx);
  return true;
}
/// Completes warp w's collective if all its lanes are waiting in one; whether they were.
inline bool try_complete(int w) {
  Thread* lanes = block.threads + 32 * w;
  for (int l = 0; l < 32; ++l)
    if (lanes[l].state != State::warp) return false;
  complete(lanes);
  return true;
}

inline void run_block(uint3 idx) {
  constexpr size_t kStack = 512 * 1024, kGuard = 4096;
  block.idx = idx;
  for (char* s : block.smem) std::memset(s, 0xff, kMaxDynamicSmem);  // NaN garbage
  const int n = block.nthreads, nwarps = n / 32;
  for (int t = 0; t < n; ++t) {
    Thread& th = block.threads[t];
    if (th.stack == nullptr) {  // lazily committed pages, a guard page below (an overflow faults)
      void* m = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) fail("mmap of a thread stack failed");
      mprotect(m, kGuard, PROT_NONE);
      th.stack = static_cast<char*>(m) + kGuard;
    }
    th.state = State::run;
    th.op = Collective::none;
    th.groups.clear();
    th.open.clear();
    th.tid = uint3{static_cast<unsigned>(t), 0, 0};
    getcontext(&th.ctx);
    th.ctx.uc_stack.ss_sp = th.stack;
    th.ctx.uc_stack.ss_size = kStack;
    th.ctx.uc_link = nullptr;
    makecontext(&th.ctx, thread_main, 0);
  }
  const Schedule s = config.schedule;
  std::mt19937 rng(config.seed + static_cast<uint32_t>(block.blocks_run++));
  int warps[kMaxWarps];
  for (int w = 0; w < nwarps; ++w) warps[w] = s == Schedule::warps_reverse ? nwarps - 1 - w : w;
  for (;;) {  // one barrier interval: every thread runs to its next barrier or its end
    if (s == Schedule::round_robin) {
      for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < n; ++t) progress |= step(t);
        for (int w = 0; w < nwarps; ++w) progress |= try_complete(w);
      }
    } else {
      if (s == Schedule::warps_shuffled) std::shuffle(warps, warps + nwarps, rng);
      for (int j = 0; j < nwarps; ++j) {
        const int w = warps[j];
        for (bool progress = true; progress;) {
          progress = false;
          for (int i = 0; i < 32; ++i) progress |= step(32 * w + (s == Schedule::warps_reverse ? 31 - i : i));
          progress |= try_complete(w);
        }
      }
    }
    int done = 0, waiting = 0;
    for (int t = 0; t < n; ++t) {
      const State st = block.threads[t].state;
      done += st == State::done, waiting += st == State::barrier;
    }
    if (done == n) return;
    if (done != 0 || waiting != n) {
      char msg[160];
      std::snprintf(msg, sizeof msg,
                    "block (%u, %u, %u): %d threads at a barrier, %d finished, %d in warp collectives (divergent "
                    "barrier or collective)",
                    idx.x, idx.y, idx.z, waiting, done, n - waiting - done);
      fail(msg);
    }
    for (int t = 0; t < n; ++t) block.threads[t].state = State::run;
  }
}

/// kernel<<<grid, block_size, smem_bytes>>>(args...): every block in turn (stream: ignored, see above).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block_size, size_t smem_bytes, cudaStream_t,
            const Args&... args) {
  if (block_size.x % 32 != 0 || block_size.x == 0 || block_size.x > kMaxThreads || block_size.y != 1 ||
      block_size.z != 1)
    fail("launch: one-dimensional blocks of whole warps, at most 512 threads, only");
  if (smem_bytes > kMaxDynamicSmem) fail("launch: more dynamic shared memory than a block may have");
  if (smem_arrays().empty() && smem_bytes > 0) fail("launch: no LLMT_CUDA_EMU_DYNAMIC_SMEM in the kernel's file");
  block.smem.clear();
  for (char* (*array)() : smem_arrays()) block.smem.push_back(array());
  block.smem_bytes = smem_bytes;
  block.grid = grid;
  block.dim = dim3(block_size.x, 1, 1);
  block.nthreads = static_cast<int>(block_size.x);
  block.body = [&] { kernel(args...); };
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) run_block(uint3{x, y, z});
  block.body = nullptr;
}

/// `kernel<<<grid, block, smem, stream>>>(args...)` as the emulator's copy of a kernel file spells it
/// (tests/CMakeLists.txt llmt_emu_kernel): `kernel * Chevrons(grid, block, smem, stream)(args...)`, which launches.
struct Chevrons {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Chevrons(dim3 g, dim3 b, size_t bytes = 0, cudaStream_t s = nullptr) : grid(g), block(b), smem(bytes), stream(s) {}
  template <typename... Args>
  struct Call {
    const Chevrons& at;
    std::tuple<const Args&...> args;
  };
  template <typename... Args>
  Call<Args...> operator()(const Args&... args) const {
    return {*this, std::tuple<const Args&...>(args...)};
  }
};
template <typename... Params, typename... Args>
void operator*(void (*kernel)(Params...), const Chevrons::Call<Args...>& call) {
  std::apply([&](const Args&... a) { launch(kernel, call.at.grid, call.at.block, call.at.smem, call.at.stream, a...); },
             call.args);
}

}  // namespace emu

// ---- the CUDA built-ins the kernels use ----

#define threadIdx (::emu::self().tid)
#define blockIdx (::emu::block.idx)
#define blockDim (::emu::block.dim)
#define gridDim (::emu::block.grid)
#define __syncthreads() ::emu::syncthreads()

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::emu::shfl_xor(mask, v, lane_mask, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::emu::shfl_up(mask, v, delta, width);
}
inline int __reduce_max_sync(unsigned mask, int v) { return ::emu::reduce_max(mask, v); }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return ::emu::reduce_max(mask, v); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __fdividef(float x, float y) { return x / y; }  // (the exact quotient; the GPU's is within 2 ulp)
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dmul_rn(double x, double y) { return x * y; }
inline double __fma_rn(double x, double y, double z) { return std::fma(x, y, z); }

// The runtime's C++ overloads for kernels that cuda_runtime.h declares for nvcc only (the C functions they call:
// cuda_emu_runtime.cpp).
template <typename T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* entry) {
  return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(entry));
}
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// Execution-space and launch attributes: nothing on the host (the headers' versions are attributes g++ warns about).
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __launch_bounds__
#define __launch_bounds__(...)
#ifndef __noinline__
#define __noinline__  // (an inlining hint only; libstdc++'s __attribute__((__noinline__)) stays valid)
#endif
// The device's ::signbit, ::min, ::max (the math functions otherwise come from <cmath>'s global declarations).
using std::max;
using std::min;
using std::signbit;
// Static __shared__ variables: one per OS thread, shared by the fibers (the threads of the block); `extern
// __shared__` (dynamic shared memory) declares the kernel file's LLMT_CUDA_EMU_DYNAMIC_SMEM array.
#undef __shared__
#define __shared__ thread_local

/// The dynamic shared memory of the kernels of the enclosing namespace (see the top of this file), as an array of
/// `type` (the element type of the kernels' `extern __shared__ type name[]`). (The dynamically initialised
/// thread_local makes g++ emit the TU's __tls_init, which its accesses to `extern thread_local` arrays of internal
/// linkage call.)
#define LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(type, name)                                                        \
  alignas(128) thread_local type name[::emu::kMaxDynamicSmem / sizeof(type)];                          \
  [[maybe_unused]] const bool name##_emu_registered_ =                                                 \
      ::emu::register_smem([]() -> char* { return reinterpret_cast<char*>(name); });                  \
  [[maybe_unused]] thread_local const bool name##_emu_tls_ = ::emu::register_smem(nullptr)
#define LLMT_CUDA_EMU_DYNAMIC_SMEM(name) LLMT_CUDA_EMU_DYNAMIC_SMEM_OF(char, name)
