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

template <class State, int kThreads>
struct HostBlock {
  static constexpr int threads = kThreads;
  std::vector<State> regs = std::vector<State>(kThreads);
  template <class F>
  void phase(F&& f) {
    for (int t = 0; t < kThreads; ++t) f(t, regs[static_cast<size_t>(t)]);
  }
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
