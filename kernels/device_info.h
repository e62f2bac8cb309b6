// kernels/device_info.h — what CUDA device, if any, this process can use.
#pragma once

#include <string>

namespace olmoref::cuda {

struct DeviceInfo {
  bool available = false;  // false: no driver, no device, or built without CUDA
  std::string name;
  int sm_count = 0;
  int compute_major = 0, compute_minor = 0;
  std::string reason;      // why unavailable
};

DeviceInfo query_device();

// Runs one tiny kernel (canonical fma chain) on the device and returns its result bits, to prove the
// toolchain, driver and device work together. Only meaningful when query_device().available.
float smoke_fma_chain(const float* a, const float* b, int n);

// a * b + c written as two operations, compiled as the kernels are (-fmad=false): the device's result, which must be
// the product rounded and then the sum rounded, never one fused multiply-add (the kernels' bits depend on it: every
// fma they want is written as one).
float smoke_contraction(float a, float b, float c);

}  // namespace olmoref::cuda
