// ref/gemm_simd_tile.h — private to ref/gemm_avx2.cpp and ref/gemm_avx512.cpp: the register-tile micro-kernel
// written once over an ISA's vector traits, so both paths issue the same loads, broadcasts and FMAs in the same
// order per output and differ only in vector width and tile height.
//
// Isa (declared in the including TU's anonymous namespace, for the internal linkage gemm_kernels.h explains):
//   Vec, Mask            the float vector and the lane mask of the last, partial vector of a tile row
//   W, MR, NV            floats per vector, tile rows, vectors per tile row (NR = W * NV)
//   zero() load(p) store(p, v) load_masked(p, m) store_masked(p, m, v) broadcast(p) fmadd(a, b, c)
//   tail_mask(rem)       the first rem (1..W) lanes
// Each accumulator lane is one C[i,j] and sees A(i,p)·B(p,j) for p in order: vectorised over j, broadcast over
// i, never over K.
#pragma once

#include <cstdint>

#include "ref/gemm_kernels.h"

namespace olmoref::gemm_detail {

// ROWS <= Isa::MR valid rows, NVEC <= Isa::NV vectors. MASKED: the last vector holds fewer than W valid columns
// (`last`), so C and (when B is read in place) B are loaded/stored under the mask, never past column nn.
template <class Isa, int ROWS, int NVEC, int AMODE, bool MASKED>
static void simd_micro_tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                            int64_t ldc, typename Isa::Mask last, bool load_c, const float* c_next) {
  using Vec = typename Isa::Vec;
  constexpr int W = Isa::W;
  if (c_next) {
    // The next tile's C rows come from L2/L3 (or DRAM for a 4096-wide output); ask for each of their 64-byte
    // lines now so the next tile's first load/store does not wait.
    constexpr int kLines = (NVEC * W * 4 + 63) / 64;
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int l = 0; l < kLines; ++l) __builtin_prefetch(c_next + r * ldc + 16 * l, 1, 3);
  }
  Vec acc[ROWS][NVEC];
  if (load_c) {
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v)
        acc[r][v] = MASKED && v == NVEC - 1 ? Isa::load_masked(c + r * ldc + W * v, last)
                                            : Isa::load(c + r * ldc + W * v);
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = Isa::zero();
  }
  for (int64_t p = 0; p < kc; ++p) {
    Vec bv[NVEC];
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v)
      bv[v] = MASKED && v == NVEC - 1 ? Isa::load_masked(b + p * ldb + W * v, last) : Isa::load(b + p * ldb + W * v);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const Vec av = Isa::broadcast(AMODE == kARow ? &a[r * lda + p] : &a[p * lda + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = Isa::fmadd(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) {
      if (MASKED && v == NVEC - 1)
        Isa::store_masked(c + r * ldc + W * v, last, acc[r][v]);
      else
        Isa::store(c + r * ldc + W * v, acc[r][v]);
    }
}

template <class Isa>
using SimdTileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t,
                            typename Isa::Mask, bool, const float*);

// Edge tiles (fewer rows or columns) are rare; they go through a table of all instantiations.
template <class Isa, int AMODE, int ROWS>
static SimdTileFn<Isa> simd_pick_vec(int nvec, bool masked) {
  static_assert(Isa::NV == 2, "simd_pick_vec instantiates tiles of 1 or 2 vectors");
  if (nvec == 1)
    return masked ? &simd_micro_tile<Isa, ROWS, 1, AMODE, true> : &simd_micro_tile<Isa, ROWS, 1, AMODE, false>;
  return masked ? &simd_micro_tile<Isa, ROWS, 2, AMODE, true> : &simd_micro_tile<Isa, ROWS, 2, AMODE, false>;
}

// rows is 1..ROWS; ROWS starts at Isa::MR and counts down to the instantiation that fits.
template <class Isa, int AMODE, int ROWS>
static SimdTileFn<Isa> simd_pick(int rows, int nvec, bool masked) {
  if constexpr (ROWS > 1)
    if (rows < ROWS) return simd_pick<Isa, AMODE, ROWS - 1>(rows, nvec, masked);
  return simd_pick_vec<Isa, AMODE, ROWS>(nvec, masked);
}

// Kern::tile for gemm_drive (gemm_kernels.h): C[0:mm, 0:nn] of one register tile.
template <class Isa>
static void simd_tile(int mm, int nn, int64_t kc, AMode amode, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc, bool load_c, const float* c_next) {
  constexpr int W = Isa::W, MR = Isa::MR, NV = Isa::NV;
  const int nvec = (nn + W - 1) / W, rem = nn - W * (nvec - 1);
  const bool masked = rem != W;
  const typename Isa::Mask last = Isa::tail_mask(rem);
  if (mm == MR && nvec == NV && !masked) {
    if (amode == kARow) simd_micro_tile<Isa, MR, NV, kARow, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
    else simd_micro_tile<Isa, MR, NV, kACol, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
  } else {
    (amode == kARow ? simd_pick<Isa, kARow, MR>(mm, nvec, masked)
                    : simd_pick<Isa, kACol, MR>(mm, nvec, masked))(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
  }
}

}  // namespace olmoref::gemm_detail
