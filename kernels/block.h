// kernels/block.h — a CUDA thread block written once, run on the device or executed on the host.
//
// A kernel body is a sequence of phases separated by barriers. A phase is a function f(tid, regs) of the
// thread index and that thread's registers (a State). On the device every thread runs the phase and then
// __syncthreads(); on the host (HostBlock) the phase runs for tid = 0, 1, ..., kThreads-1 before the next
// phase starts. A body with no data race between barriers computes the same values both ways, so CI (which
// has no GPU) executes each kernel's real decomposition — its tiles, lanes, trees and loop bounds — and
// compares it bit for bit with ref/. Shared memory is a struct the caller provides: `__shared__` on the
// device, a local object on the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hd.h"

// Before each OLMOREF_HD body templated on its Block: the host instantiation (HostBlock) calls host-only code, which
// nvcc would otherwise report for every instantiation; the device one never does.
#if defined(__CUDACC__)
#define OLMOREF_BLOCK_BODY _Pragma("nv_exec_check_disable")
#else
#define OLMOREF_BLOCK_BODY
#endif

namespace olmoref::kernels {

// The race check: how HostBlock runs one phase's threads. A body with no race between barriers computes the same bits
// in every order, so the kernels' host tests run in each and compare with ref/ (tests/kernels). forward is tid 0, 1,
// ...; reverse is kThreads-1 down to 0 (a thread reads what a higher one writes in the same phase: other bits);
// snapshot runs every thread against the shared memory as the phase found it, each thread's writes merged at the
// barrier, and stops at a byte of shared memory written by two threads in one phase (a thread that reads what another
// writes in the same phase sees the old value: other bits). What it cannot see: a write of the value already there,
// and races in global memory.
enum class HostOrder { forward, reverse, snapshot };
inline HostOrder& host_block_order() {
  static HostOrder order = HostOrder::forward;
  return order;
}

// Thrown by the snapshot order at a byte of shared memory two threads write in one phase.
struct SharedWriteRace : std::logic_error {
  using std::logic_error::logic_error;
};

template <class State, int kThreads>
struct HostBlock {
  static constexpr int threads = kThreads;
  std::vector<State> regs = std::vector<State>(kThreads);

  HostBlock() = default;
  // The block's shared memory (the struct its body is given), for the snapshot order.
  template <class Shared>
  explicit HostBlock(Shared& shared) : shared_(reinterpret_cast<unsigned char*>(&shared)), shared_bytes_(sizeof(Shared)) {}

  template <class F>
  void phase(F&& f) {
    ++phases_;
    const HostOrder order = host_block_order();
    if (order == HostOrder::reverse) {
      for (int t = kThreads - 1; t >= 0; --t) f(t, regs[static_cast<size_t>(t)]);
    } else if (order == HostOrder::snapshot && shared_) {
      snapshot_phase(f);
    } else {
      for (int t = 0; t < kThreads; ++t) f(t, regs[static_cast<size_t>(t)]);
    }
  }

 private:
  template <class F>
  void snapshot_phase(F& f) {
    const size_t n = shared_bytes_;
    base_.assign(shared_, shared_ + n);
    merged_ = base_;
    writer_.assign(n, -1);
    constexpr size_t kBig = 2048, kChunk = 64;  // a thread writes a few elements: most of the region is skipped
    for (int t = 0; t < kThreads; ++t) {
      f(t, regs[static_cast<size_t>(t)]);
      // What thread t changed: kept in merged_ (a byte another thread changed too is a race), then undone, so the
      // next thread finds the shared memory as the phase began.
      for (size_t c = 0; c < n; c += kChunk) {
        if (c % kBig == 0 && std::memcmp(shared_ + c, base_.data() + c, std::min(kBig, n - c)) == 0) {
          c += kBig - kChunk;
          continue;
        }
        const size_t len = std::min(kChunk, n - c);
        if (std::memcmp(shared_ + c, base_.data() + c, len) == 0) continue;
        for (size_t b = c; b < c + len; ++b) {
          if (shared_[b] == base_[b]) continue;
          if (writer_[b] >= 0 && writer_[b] != t)
            throw SharedWriteRace("shared-memory race: phase " + std::to_string(phases_) + " of a block of " +
                                  std::to_string(kThreads) + " threads: threads " + std::to_string(writer_[b]) +
                                  " and " + std::to_string(t) + " both write byte " + std::to_string(b) + " of " +
                                  std::to_string(n) + " (a barrier missing between them)");
          writer_[b] = t;
          merged_[b] = shared_[b];
          shared_[b] = base_[b];
        }
      }
    }
    std::memcpy(shared_, merged_.data(), n);
  }

  unsigned char* shared_ = nullptr;
  size_t shared_bytes_ = 0;
  int64_t phases_ = 0;
  std::vector<unsigned char> base_, merged_;
  std::vector<int> writer_;
};

#if defined(__CUDACC__)
template <class State, int kThreads>
struct DeviceBlock {
  static constexpr int threads = kThreads;
  State regs;
  template <class F>
  __device__ void phase(F&& f) {
    f(static_cast<int>(threadIdx.x), regs);
    __syncthreads();
  }
};
#endif

// The canonical 32-lane tree (core/reduce.h lane_tree) over lane[0..32) in shared memory, one level per phase:
// for w = 16, 8, 4, 2, 1: lane[j] = lane[j] + lane[j + w] for j < w. The result is in lane[0].
OLMOREF_BLOCK_BODY
template <class Block, class T>
OLMOREF_HD void lane_tree_phases(Block& blk, T* lane) {
  for (int w = 16; w >= 1; w /= 2)
    blk.phase([&](int t, auto&) {
      if (t < w) lane[t] = lane[t] + lane[t + w];
    });
}

struct NoRegs {};

}  // namespace olmoref::kernels
