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

#include "ref/hd.h"

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

}  // namespace olmoref::kernels
