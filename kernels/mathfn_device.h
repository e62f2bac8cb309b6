// kernels/mathfn_device.h — core/mathfn_impl.h evaluated on the device, for the GPU tests (the same source as
// the CPU's det:: functions, so the bits must agree on every input).
#pragma once

#include <cstdint>

namespace olmoref::kernels {

enum class MathFn { expf, logf, sigmoidf, siluf };
// out[i] = fn(in[i]) on the device (host arrays in and out; copies included).
void mathfn_on_device(MathFn fn, const float* in, float* out, int64_t n);

}  // namespace olmoref::kernels
