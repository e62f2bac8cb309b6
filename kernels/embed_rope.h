// kernels/embed_rope.h — exact-mode embedding forward/backward and RoPE (docs/canonical/norm-rope-swiglu.md).
// All pointers are device pointers. Embedding backward sums each table row's positions in position order
// (the order embedding_position_order gives: no atomics); RoPE applies ref/elementwise.h's pair formulas.
#pragma once

#include <cstdint>

namespace olmoref::kernels {

// x[r, :] = table[tokens[r], :]; one thread per element.
void embedding_forward_device(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d);
// dtable[v, c] = ((dx[p0, c] + dx[p1, c]) + ...) over token v's positions p0 < p1 < ... (start/order as
// ref/ops.h embedding_position_order, on the device); rows of absent tokens +0. One thread per (v, c).
void embedding_backward_device(const int64_t* start, const int64_t* order, const float* dx, float* dtable, int64_t V,
                               int64_t d);
// x [rows, n_heads·hd] rotated in place; row r has position r % T; cos/sin [T, hd/2].
void rope_forward_device(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                         const float* sin);
void rope_backward_device(float* dx, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                          const float* sin);

}  // namespace olmoref::kernels
