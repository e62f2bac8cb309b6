// ref/ops.h — forward and backward of every Olmo 3 op except the matrix product (ref/gemm.h).
//
// Shapes use: R rows (tokens of a micro-batch, B*T), T sequence length, H query heads, KV key/value
// heads, hd head dim, V vocabulary. Tensors are row-major and contiguous unless stated. All ops are
// threaded over non-reduction dimensions only; docs/canonical/*.md states each op's order.
#pragma once

#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "core/embedding_order.h"
#include "core/model_config.h"
#include "core/op_types.h"

namespace olmoref {

class ThreadPool;

// ---- RMSNorm: y = w ⊙ (x · r), r = 1/sqrt(mean(x²) + eps), sum of squares by canonical_dot ----
// x, y: [R, n]; w: [n]; inv_rms: [R] (saved for backward).
void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n, float eps,
                     ThreadPool* pool);
// Fused (docs/canonical/norm-rope-swiglu.md "Fused forms"): out [R, n] = res [R, n] + RMSNorm(x), exactly
// rmsnorm_forward; round_bf16 (bf16); add(res, ·); round_bf16 (bf16). out may be res.
void rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out, float* inv_rms, int64_t R,
                              int64_t n, float eps, bool bf16, ThreadPool* pool);
// dx [R, n] = ∂/∂x (overwritten); dw [n] = Σ_rows dy ⊙ x̂ (one fma chain over rows in order, overwritten; with
// accumulate continued from dw's values, so rows split in runs give the whole's bits).
void rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, float* dw,
                      int64_t R, int64_t n, ThreadPool* pool, bool accumulate = false);

// ---- Rotary embedding, rotate-half pairing (d with d + hd/2) ----
struct RopeTable {
  int64_t seq_len = 0, head_dim = 0;
  std::vector<float> cos, sin;  // [T, hd/2]
};
// inv_freq_j = 1 / θ^(2j/hd) in fp32 (as PyTorch computes it), angle = float(t) · inv_freq_j in fp32,
// then cos/sin of that fp32 angle from the project's fp64 functions, rounded once.
RopeTable make_rope_table(int64_t seq_len, int64_t head_dim, double theta);
// The same with scaled frequencies, as OLMo-core's YaRNRoPEScalingConfig computes them in fp32: the base inv_freq
// blended with inv_freq / factor by a linear ramp over the dimensions between beta_fast and beta_slow rotations of
// the old context, then cos and sin each multiplied by the attention factor. scaling.on() false: the plain table.
RopeTable make_rope_table(int64_t seq_len, int64_t head_dim, double theta, const RopeScaling& scaling);
// x: [B*T, n_heads*hd], rotated in place; position of row r is r % T.
void rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeTable& table, ThreadPool* pool);
// dx = Rᵀ dy in place.
void rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeTable& table, ThreadPool* pool);
// The same on tables given as cos, sin [T, hd/2]; positions [rows] (intra-document masking, elem::rope_position)
// replaces r % T when given.
void rope_forward(float* x, int64_t rows, int64_t n_heads, int64_t T, int64_t hd, const float* cos, const float* sin,
                  ThreadPool* pool, const int32_t* positions = nullptr);
void rope_backward(float* dx, int64_t rows, int64_t n_heads, int64_t T, int64_t hd, const float* cos,
                   const float* sin, ThreadPool* pool, const int32_t* positions = nullptr);
// QK-norm then RoPE, fused: y [R, n_heads·hd] = RoPE(RMSNorm(x)) with w [n_heads·hd], exactly rmsnorm_forward;
// round_bf16 (bf16); rope_forward; round_bf16 (bf16). inv_rms [R] saved as rmsnorm_forward saves it.
void rmsnorm_rope_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n_heads,
                          int64_t T, int64_t hd, const float* cos, const float* sin, float eps, bool bf16,
                          ThreadPool* pool, const int32_t* positions = nullptr);
// Its backward, fused: dy [R, n_heads·hd] (∂q) is rotated back in place, rope_backward; round_bf16 (bf16), then
// dx [R, n] and dw [n] exactly as rmsnorm_backward(x, w, inv_rms, dy, ...) on the rotated dy.
void rope_rmsnorm_backward(const float* x, const float* w, const float* inv_rms, float* dy, float* dx, float* dw,
                           int64_t R, int64_t n_heads, int64_t T, int64_t hd, const float* cos, const float* sin,
                           bool bf16, ThreadPool* pool, const int32_t* positions = nullptr, bool accumulate = false);

// ---- SwiGLU: a = silu(g) ⊙ u ----
void swiglu_forward(const float* g, const float* u, float* a, int64_t n, ThreadPool* pool);
void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                     ThreadPool* pool);
// bf16 recipe (docs/canonical/bf16.md): g, u, da bf16-valued; s = bf16(silu(g)), a = bf16(s·u);
// backward du = bf16(da·s), dg = bf16(bf16(da·u) · silu'(g)), silu' in fp32 as in swiglu_backward.
void swiglu_forward_bf16(const float* g, const float* u, float* a, int64_t n, ThreadPool* pool);
void swiglu_backward_bf16(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                          ThreadPool* pool);
// SwiGLU fused into the products around it, as GEMM epilogues (ref/gemm.h GemmEpilogue): each computes exactly
// the unfused sequence, element by element, right after the element's chain ends.
// u [M, N] = X [M, K] · W3 [N, K]ᵀ (bf16: rounded), then a [M, N] = SwiGLU(g, u) with the gate g [M, N] given:
// matmul_forward; round (bf16); swiglu_forward(_bf16).
void matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a, int64_t M, int64_t N,
                           int64_t K, bool bf16, ThreadPool* pool);
// da [M, K] = dY [M, N] · W2 [N, K] (bf16: rounded), then dg, du [M, K] = SwiGLU backward of (g, u, da):
// matmul_backward_input; round (bf16); swiglu_backward(_bf16). da is never a tensor of its own: its chains run
// in dg, which the epilogue overwrites in place.
void matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u, float* dg, float* du,
                                  int64_t M, int64_t N, int64_t K, bool bf16, ThreadPool* pool);

// ---- Causal (sliding-window) attention with GQA (the shape: core/op_types.h AttentionShape) ----
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                       float* row_max, float* row_sum, ThreadPool* pool);
// dq [B*T, H*hd], dk, dv [B*T, KV*hd] overwritten (the rows of the shape's queries and keys only).
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                        const float* row_max, const float* row_sum, const float* dout, float* dq, float* dk,
                        float* dv, ThreadPool* pool);

// ---- Embedding ----
void embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d, ThreadPool* pool);
// dtable [V, d] overwritten: row v = Σ over positions with token v, in position order (plain adds from +0; with
// accumulate from dtable's values).
void embedding_backward(const uint32_t* tokens, const float* dx, float* dtable, int64_t R, int64_t V, int64_t d,
                        ThreadPool* pool, bool accumulate = false);

// ---- Cross-entropy + z-loss over shifted labels ----
// logits [B*T, V] are replaced by ∂loss/∂logits, where loss = Σ_valid (ce + z_coef·lse²) / n_targets.
// Position t of an instance predicts token t+1; the last position of each instance has no target.
// Returns the fp64 sums Σ ce and Σ z_coef·lse² over this micro-batch's valid positions.
LossSums cross_entropy_forward_backward(float* logits, const uint32_t* tokens, int64_t B, int64_t T, int64_t V,
                                        float z_coef, int64_t global_n_targets, ThreadPool* pool);
// The same for positions [t0, t0 + rows) of one instance (tokens [T]): logits [rows, V] become the gradient and
// ce_terms, z_terms [rows] receive the rows' fp64 terms (Executor::cross_entropy_rows).
void cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T, int64_t V,
                        float z_coef, int64_t global_n_targets, double* ce_terms, double* z_terms, ThreadPool* pool);

// ---- The instance tree's add (docs/canonical/step.md): dst[0..n) = dst[0..n) + src[0..n) ----
void tree_add(float* dst, const float* src, int64_t n, ThreadPool* pool);

}  // namespace olmoref
