// GPU smoke test: the CUDA target runs one canonical fma chain on the device and must return the CPU
// reference's bits. Without a device (this project's CI machines) it prints SKIPPED and exits 77,
// which meson counts as skipped, never as passed.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/device_info.h"
#include "core/reduce.h"

int main() {
  const olmoref::cuda::DeviceInfo dev = olmoref::cuda::query_device();
  if (!dev.available) {
    std::printf("SKIPPED: no CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
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
  return 0;
}
