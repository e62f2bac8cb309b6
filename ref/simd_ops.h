// ref/simd_ops.h — the AVX-512 and AVX2 paths of the CPU reference's non-GEMM ops (attention, softmax over the
// vocabulary, RMSNorm, SwiGLU, expf/logf/sigmoid/SiLU). The scalar code in ref/ops.cpp and core/mathfn_impl.h is the
// definition; these paths perform the same IEEE operations in the same order per output element, only many
// outputs at once (one per SIMD lane: 16 keys, queries or columns in a zmm register), so every result is
// bit-identical to the scalar one (tests/ref/test_simd.cpp: each path against the scalar code; golden-traces and
// e2e-cpu-isa: whole runs on every path).
//
// Which path runs follows the GEMM's (ref/gemm.h: set_gemm_isa / active_gemm_isa, `--cpu-isa` on the CLI): one
// switch for the whole CPU executor. The kernels live in ref/simd_avx512.cpp and ref/simd_avx2.cpp, compiled
// with their own -m flags and picked at run time, so a baseline build still has them. They do no threading and
// no allocation: ref/ops.cpp splits the work (over non-reduction dimensions only) and hands them scratch.
//
// Not on these paths (the scalar definition runs): bf16 SwiGLU, and attention head dims that are not a multiple of
// the lane count (or above 16 registers). bf16 attention is on them, with its rounding points (docs/canonical/bf16.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ref/gemm.h"
#include "ref/ops.h"

namespace olmoref::simd {

struct SimdOps {
  const char* name;
  int lanes;  // floats per register

  // ---- attention over (instance, head) tasks [task_begin, task_end) of B*H; the shape's hd % lanes == 0 ----
  size_t (*attention_forward_scratch)(const AttentionShape& s);  // floats
  void (*attention_forward)(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                            float* row_max, float* row_sum, int64_t task_begin, int64_t task_end, float* scratch);
  size_t (*attention_backward_scratch)(const AttentionShape& s);
  // dk_head, dv_head: [B, H, T, hd], zero on entry (per query head, before the GQA group sum).
  void (*attention_backward)(const AttentionShape& s, const float* q, const float* k, const float* v,
                             const float* out, const float* row_max, const float* row_sum, const float* dout,
                             float* dq, float* dk_head, float* dv_head, int64_t task_begin, int64_t task_end,
                             float* scratch);

  // ---- elementwise ----
  void (*swiglu_forward)(const float* g, const float* u, float* a, int64_t n);
  void (*swiglu_backward)(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n);
  void (*expf)(const float* x, float* y, int64_t n);
  void (*logf)(const float* x, float* y, int64_t n);
  void (*sigmoidf)(const float* x, float* y, int64_t n);
  void (*siluf)(const float* x, float* y, int64_t n);

  // ---- reductions (core/reduce.h's canonical order) ----
  float (*canonical_sum)(const float* x, int64_t n);
  float (*canonical_dot)(const float* a, const float* b, int64_t n);
  // The sequential max of x[0..n) (first occurrence of the largest value; NaN ignored, -inf when n = 0).
  float (*row_max)(const float* x, int64_t n);
  // Softmax numerator in place: m = row_max(x), x = expf(x − m), returns canonical_sum(x); *m_out = m.
  float (*exp_shift_sum)(float* x, int64_t n, float* m_out);
  // Cross-entropy gradient of a row from its numerators: x = ((x / S) · coef) · inv_n.
  void (*scale_probs)(float* x, int64_t n, float S, float coef, float inv_n);

  // ---- RMSNorm over rows [r0, r1) / columns [c0, c1) (ref/ops.h) ----
  // y = elem::fused_norm_output(w ⊙ (x · r), res, ...): res [R, n] the residual added after the norm (nullptr:
  // plain RMSNorm), bf16 the unfused sequence's rounding points (false and nullptr: exactly rmsnorm_forward).
  void (*rmsnorm_forward_rows)(const float* res, const float* x, const float* w, float* y, float* inv_rms, int64_t r0,
                               int64_t r1, int64_t n, float eps, bool bf16);
  void (*rmsnorm_backward_rows)(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx,
                                int64_t r0, int64_t r1, int64_t n);
  // accumulate: the chains continue from dw's values (else from +0).
  void (*rmsnorm_dw_cols)(const float* x, const float* inv_rms, const float* dy, float* dw, int64_t R, int64_t n,
                          int64_t c0, int64_t c1, bool accumulate);
};

// The path for `isa` (nullptr for scalar, or where the CPU/build lacks it).
const SimdOps* simd_ops_for(GemmIsa isa);
// The path the CPU executor uses now (nullptr: the scalar definition).
const SimdOps* active_simd_ops();

// Per-ISA tables (ref/simd_avx512.cpp, ref/simd_avx2.cpp).
const SimdOps& simd_ops_avx512();
const SimdOps& simd_ops_avx2();

}  // namespace olmoref::simd
