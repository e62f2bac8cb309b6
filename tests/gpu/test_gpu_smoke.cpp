// GPU smoke test: the CUDA target runs one canonical fma chain on the device and must return the CPU reference's
// bits; the contraction probe; the exchange staging page-locked, with its copy rates. Without a device (this
// project's CI machines) it prints SKIPPED and exits 77, which meson counts as skipped, never as passed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/device_memory.h"
#include "core/executor.h"
#include "core/reduce.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "model/executors.h"

// --nccl: the NCCL transport's exchange (dist::NcclComm) on this GPU, in a group of one rank (NCCL refuses two ranks on
// one GPU): a kernel scales the source on the default stream, the exchange sends three pieces of it to this rank in
// another order, and the destination must hold exactly the scaled pieces where the plan put them (the group ordered
// after the kernel that wrote its source, and before the copy that reads its destination). 77 when NCCL's library is
// not on this machine.
static int nccl_check() {
  using namespace olmoref;
  const std::unique_ptr<Executor> ex = make_executor("cuda", nullptr);
  const int64_t free_before = kernels::device_free_bytes();
  std::unique_ptr<dist::NcclComm> nccl;
  try {
    nccl = std::make_unique<dist::NcclComm>(dist::world(), *ex);
  } catch (const std::runtime_error& e) {
    if (std::strstr(e.what(), "was not found") == nullptr) throw;
    std::printf("SKIPPED: %s\n", e.what());
    return 77;
  }
  const int64_t n = (int64_t{1} << 22) + 3;
  std::vector<float> pattern(static_cast<size_t>(n)), got(pattern.size());
  for (int64_t i = 0; i < n; ++i) pattern[static_cast<size_t>(i)] = std::sin(0.001f * static_cast<float>(i)) * 3.0f;
  Buffer<float> src(*ex, n, "NCCL check: source"), dst(*ex, n, "NCCL check: destination");
  src.upload(pattern.data(), n);
  ex->scale(src.data(), 2.0f, n);  // exact: a power of two
  dist::ExchangePlan plan(1);
  plan.send[0] = {{5, 100}, {0, 5}, {105, n - 105}};
  plan.recv[0] = {{0, 100}, {100, 5}, {105, n - 105}};
  const auto check_buffer = [&](Buffer<float>& out, float factor, const char* how) {
    out.download(got.data(), n);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t from = i < 100 ? i + 5 : i < 105 ? i - 100 : i;
      const float want = pattern[static_cast<size_t>(from)] * factor;
      wrong += std::memcmp(&want, &got[static_cast<size_t>(i)], sizeof want) != 0;
    }
    if (wrong > 0)
      std::printf("FAILED: NCCL's exchange %s: %lld of %lld floats differ from the plan's\n", how,
                  static_cast<long long>(wrong), static_cast<long long>(n));
    else
      std::printf("OK: NCCL moved %lld floats %s as the plan says\n", static_cast<long long>(n), how);
    return wrong == 0;
  };
  const auto check_dst = [&](float factor, const char* how) { return check_buffer(dst, factor, how); };
  nccl->exchange(src.data(), dst.data(), plan, "NCCL check");
  if (!check_dst(2.0f, "on the default stream, after the kernel that wrote them")) return 1;
  // NCCL's own device memory for one communicator and its first exchange (the memory model's estimate,
  // kNcclCommEstimateBytes, is 512 MiB a communicator): the free memory's drop, less this check's two buffers.
  const int64_t taken = free_before - kernels::device_free_bytes() - 2 * n * static_cast<int64_t>(sizeof(float));
  std::printf("NCCL: one communicator (1 rank) and its first exchange took %.1f MiB of device memory\n",
              static_cast<double>(taken) / (1 << 20));
  // The FSDP prefetch's ordering (dist::UnitGather): the kernel on the default stream, then the exchange on a side
  // stream that waits for it, then the default stream waiting for the side stream before the copy reads dst.
  kernels::SideStream side;
  ex->scale(src.data(), 2.0f, n);
  side.wait_for_default();
  nccl->exchange(src.data(), dst.data(), plan, "NCCL check (side stream)", side.stream());
  side.default_waits();
  if (!check_dst(4.0f, "on a side stream ordered by events")) return 1;
  // The owners' exchange under overlap (dist::OwnerReduction): the group and then the executor's ops on the side
  // stream (kernels::StreamScope: a copy and a tree add there, reading what the group wrote), the default stream
  // waiting for all of it before the download. sum = dst + dst, exact.
  Buffer<float> sum(*ex, n, "NCCL check: the adds' destination");
  ex->scale(src.data(), 2.0f, n);
  side.wait_for_default();
  nccl->exchange(src.data(), dst.data(), plan, "NCCL check (side stream, then adds)", side.stream());
  {
    const kernels::StreamScope on_side(side.stream());
    ex->copy(sum.data(), dst.data(), static_cast<size_t>(n) * sizeof(float));
    ex->tree_add(sum.data(), dst.data(), n);
  }
  side.default_waits();
  return check_buffer(sum, 16.0f, "on a side stream, then added there by the executor's ops") ? 0 : 1;
}

// The MPI transport's staging (Executor::allocate_staging) on the device executor: page-locked host memory, through
// which a block goes to the device and back unchanged; and the copies' rates from it against ordinary (pageable)
// memory, 256 MiB each way: the figure the staging is for (docs/executors.md, "Transports").
static bool staging_check() {
  using namespace olmoref;
  const std::unique_ptr<Executor> ex = make_executor("cuda", nullptr);
  const int64_t n = int64_t{64} << 20;  // floats: 256 MiB
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  StagingVector<float> pinned(StagingAllocator<float>(*ex, "staging check"));
  pinned.resize(static_cast<size_t>(n));
  if (!ex->staging_pinned() || !kernels::is_pinned(pinned.data())) {
    std::printf("FAILED: the cuda executor's exchange staging is not page-locked host memory\n");
    return false;
  }
  std::vector<float> pageable(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pageable[static_cast<size_t>(i)] = static_cast<float>(i % 65521) * 0.25f;
  std::memcpy(pinned.data(), pageable.data(), bytes);
  Buffer<float> dev(*ex, n, "staging check: device block");
  const auto seconds = [&](auto&& copy) {
    copy();  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 3; ++r) copy();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3;
  };
  const double gb = static_cast<double>(bytes) / 1e9;
  const double up_pageable = seconds([&] { dev.upload(pageable.data(), n); });
  const double up_pinned = seconds([&] { dev.upload(pinned.data(), n); });
  const double down_pageable = seconds([&] { dev.download(pageable.data(), n); });
  std::fill(pinned.begin(), pinned.end(), -1.0f);
  const double down_pinned = seconds([&] { dev.download(pinned.data(), n); });
  if (std::memcmp(pinned.data(), pageable.data(), bytes) != 0) {
    std::printf("FAILED: a block through the page-locked staging came back changed\n");
    return false;
  }
  std::printf("OK: exchange staging page-locked; 256 MiB to the device %.1f GB/s pinned vs %.1f pageable, back "
              "%.1f GB/s pinned vs %.1f pageable\n",
              gb / up_pinned, gb / up_pageable, gb / down_pinned, gb / down_pageable);
  return true;
}

int main(int argc, char** argv) {
  const olmoref::cuda::DeviceInfo dev = olmoref::cuda::query_device();
  if (!dev.available) {
    std::printf("SKIPPED: no CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
  if (argc > 1 && std::strcmp(argv[1], "--nccl") == 0) return nccl_check();
  std::printf("device: %s, %d SMs, sm_%d%d\n", dev.name.c_str(), dev.sm_count, dev.compute_major, dev.compute_minor);
  std::vector<float> a(4099), b(4099);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 3 ? 1.0f : 1e-3f);
    b[i] = std::cos(0.11f * static_cast<float>(i)) * (i % 5 ? 1.0f : 1e3f);
  }
  const float cpu = olmoref::chain_dot(a.data(), b.data(), static_cast<int64_t>(a.size()));
  const float gpu = olmoref::cuda::smoke_fma_chain(a.data(), b.data(), static_cast<int>(a.size()));
  uint32_t cb, gb;
  std::memcpy(&cb, &cpu, 4);
  std::memcpy(&gb, &gpu, 4);
  std::printf("cpu %08x gpu %08x\n", cb, gb);
  if (cb != gb) {
    std::printf("FAILED: the device's fma chain differs from the CPU reference\n");
    return 1;
  }
  std::printf("OK: bitwise equal\n");
  // The contraction probe: a = 1 + 2^-12, a * a = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11, so a * a + c with
  // c = -(1 + 2^-11) is 0 when the product is rounded first and 2^-24 when fused into one fma.
  const float pa = 1.0f + std::ldexp(1.0f, -12), pc = -(1.0f + std::ldexp(1.0f, -11));
  const float fused = std::fma(pa, pa, pc);
  volatile float product = pa * pa;
  const float unfused = product + pc;
  const float device = olmoref::cuda::smoke_contraction(pa, pa, pc);
  std::printf("contraction probe: a*b+c on the device %a (unfused %a, fused %a)\n", static_cast<double>(device),
              static_cast<double>(unfused), static_cast<double>(fused));
  if (unfused == fused || device != unfused) {
    std::printf("FAILED: %s\n", unfused == fused ? "the probe cannot tell fused from unfused"
                                                 : "the device fused a*b+c into one fma: the kernels' build must keep "
                                                   "-fmad=false (kernels/meson.build)");
    return 1;
  }
  std::printf("OK: a*b+c is not contracted\n");
  return staging_check() ? 0 : 1;
}
