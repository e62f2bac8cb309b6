// kernels/elementwise.h — exact-mode elementwise kernels: SwiGLU (fp32 and the bf16 recipe), AdamW on a range
// of the flat vector, bf16 rounding, the instance tree's add and gradient scaling (clipping). Their arithmetic
// is ref/elementwise.h and ref/bf16.h, the very functions the CPU loops call; one thread per element.
// All pointers are device pointers.
#pragma once

#include <cstdint>

#include "ref/elementwise.h"

namespace olmoref::kernels {

void swiglu_forward_device(const float* g, const float* u, float* a, int64_t n, bool bf16);
void swiglu_backward_device(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n, bool bf16);
// One parameter tensor's elements [0, n): decay is 1 for tensors without weight decay.
void adamw_device(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v, int64_t n);
void round_bf16_device(float* x, int64_t n);
void tree_add_device(float* dst, const float* src, int64_t n);  // dst = dst + src
void scale_device(float* x, float c, int64_t n);                // x = x · c

}  // namespace olmoref::kernels
