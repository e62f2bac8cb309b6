// ref/simd_ops.cpp — which SIMD path the CPU executor's non-GEMM ops take: the GEMM's (ref/gemm.h), so one switch
// (set_gemm_isa, --cpu-isa) selects scalar, AVX2 or AVX-512 for the whole executor.
#include "ref/simd_ops.h"

namespace olmoref::simd {

const SimdOps* simd_ops_for(GemmIsa isa) {
#if defined(__x86_64__)
  if (isa == GemmIsa::best) isa = active_gemm_isa();
  if (!gemm_isa_supported(isa)) return nullptr;
  if (isa == GemmIsa::avx512) return &simd_ops_avx512();
  if (isa == GemmIsa::avx2) return &simd_ops_avx2();
#else
  (void)isa;
#endif
  return nullptr;
}

const SimdOps* active_simd_ops() { return simd_ops_for(active_gemm_isa()); }

}  // namespace olmoref::simd
