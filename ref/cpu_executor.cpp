#include "ref/cpu_executor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/bf16.h"
#include "ref/gemm.h"
#include "ref/moe.h"
#include "ref/ops.h"
#include "core/optim.h"
#include "core/skip_step.h"
#include "core/parallel.h"

namespace olmoref {

void* CpuExecutor::allocate(size_t bytes, const std::string& what) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  if (!p)
    throw std::runtime_error("out of host memory allocating " + what + " (" + std::to_string(bytes >> 20) +
                             " MiB); try a smaller train.micro_batch_instances");
  return p;
}
void CpuExecutor::deallocate(void* p) { std::free(p); }
void CpuExecutor::to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuExecutor::to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
// Large copies and fills (gradient slots, parameter copies: tens of MiB) are split over the pool: one core does not
// reach the memory bandwidth. Overlapping copies stay one memmove (its direction matters).
namespace {
constexpr size_t kSplitBytes = size_t{1} << 20, kSplitGrain = size_t{256} << 10;
}  // namespace
void CpuExecutor::copy(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const bool overlap = d < s + bytes && s < d + bytes;
  if (!pool_ || pool_->size() < 2 || bytes < kSplitBytes || overlap) {
    std::memmove(dst, src, bytes);
    return;
  }
  pool_->parallel_for(static_cast<int64_t>(bytes), static_cast<int64_t>(kSplitGrain),
                      [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, static_cast<size_t>(e - b)); });
}
void CpuExecutor::zero(void* dst, size_t bytes) {
  char* d = static_cast<char*>(dst);
  if (!pool_ || pool_->size() < 2 || bytes < kSplitBytes) {
    std::memset(dst, 0, bytes);
    return;
  }
  pool_->parallel_for(static_cast<int64_t>(bytes), static_cast<int64_t>(kSplitGrain),
                      [&](int64_t b, int64_t e) { std::memset(d + b, 0, static_cast<size_t>(e - b)); });
}

void CpuExecutor::matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K) {
  olmoref::matmul_forward(X, W, Y, M, N, K, pool_);
}
void CpuExecutor::matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                                        bool accumulate) {
  olmoref::matmul_backward_input(dY, W, dX, M, N, K, accumulate, pool_);
}
void CpuExecutor::matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,
                                         bool accumulate) {
  olmoref::matmul_backward_weight(dY, X, dW, M, N, K, accumulate, pool_);
}
void CpuExecutor::matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a, int64_t M,
                                        int64_t N, int64_t K, bool bf16) {
  olmoref::matmul_forward_swiglu(X, W3, g, u, a, M, N, K, bf16, pool_);
}
void CpuExecutor::matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u,
                                               float* dg, float* du, int64_t M, int64_t N, int64_t K, bool bf16) {
  olmoref::matmul_backward_input_swiglu(dY, W2, g, u, dg, du, M, N, K, bf16, pool_);
}
void CpuExecutor::rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n,
                                  float eps) {
  olmoref::rmsnorm_forward(x, w, y, inv_rms, R, n, eps, pool_);
}
void CpuExecutor::rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx,
                                   float* dw, int64_t R, int64_t n, bool accumulate) {
  olmoref::rmsnorm_backward(x, w, inv_rms, dy, dx, dw, R, n, pool_, accumulate);
}
void CpuExecutor::rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out, float* inv_rms,
                                           int64_t R, int64_t n, float eps, bool bf16) {
  olmoref::rmsnorm_residual_forward(res, x, w, out, inv_rms, R, n, eps, bf16, pool_);
}
void CpuExecutor::rmsnorm_rope_forward(const float* x_raw, const float* w, float* y, float* inv_rms, int64_t R,
                                       int64_t n_heads, const RopeView& r, float eps, bool bf16) {
  olmoref::rmsnorm_rope_forward(x_raw, w, y, inv_rms, R, n_heads, r.seq_len, r.head_dim, r.cos, r.sin, eps, bf16,
                                pool_, r.positions);
}
void CpuExecutor::rope_rmsnorm_backward(const float* x_raw, const float* w, const float* inv_rms, float* dy, float* dx,
                                        float* dw, int64_t R, int64_t n_heads, const RopeView& r, bool bf16,
                                        bool accumulate) {
  olmoref::rope_rmsnorm_backward(x_raw, w, inv_rms, dy, dx, dw, R, n_heads, r.seq_len, r.head_dim, r.cos, r.sin, bf16,
                                 pool_, r.positions, accumulate);
}
void CpuExecutor::rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeView& r) {
  olmoref::rope_forward(x, rows, n_heads, r.seq_len, r.head_dim, r.cos, r.sin, pool_, r.positions);
}
void CpuExecutor::rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeView& r) {
  olmoref::rope_backward(dx, rows, n_heads, r.seq_len, r.head_dim, r.cos, r.sin, pool_, r.positions);
}
void CpuExecutor::swiglu_forward(const float* g, const float* u, float* a, int64_t n, bool bf16) {
  if (bf16) olmoref::swiglu_forward_bf16(g, u, a, n, pool_);
  else olmoref::swiglu_forward(g, u, a, n, pool_);
}
void CpuExecutor::swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                                  bool bf16) {
  if (bf16) olmoref::swiglu_backward_bf16(g, u, da, dg, du, n, pool_);
  else olmoref::swiglu_backward(g, u, da, dg, du, n, pool_);
}
void CpuExecutor::attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                                    float* row_max, float* row_sum) {
  olmoref::attention_forward(s, q, k, v, out, row_max, row_sum, pool_);
}
void CpuExecutor::attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                     const float* out, const float* row_max, const float* row_sum, const float* dout,
                                     float* dq, float* dk, float* dv) {
  olmoref::attention_backward(s, q, k, v, out, row_max, row_sum, dout, dq, dk, dv, pool_);
}
void CpuExecutor::embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  olmoref::embedding_forward(table, tokens, x, R, d, pool_);
}
void CpuExecutor::embedding_backward(const uint32_t* host_tokens, const float* dx, float* dtable, int64_t R,
                                     int64_t V, int64_t d, bool accumulate) {
  olmoref::embedding_backward(host_tokens, dx, dtable, R, V, d, pool_, accumulate);
}
void CpuExecutor::cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T,
                                     int64_t V, float z_coef, int64_t global_n_targets, double* ce_terms,
                                     double* z_terms) {
  olmoref::cross_entropy_rows(logits, tokens, t0, rows, T, V, z_coef, global_n_targets, ce_terms, z_terms, pool_);
}
void CpuExecutor::add(const float* a, const float* b, float* out, int64_t n) {
  auto body = [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  };
  if (pool_ && n >= (1 << 16)) pool_->parallel_for(n, 1 << 15, body);
  else body(0, n);
}
void CpuExecutor::round_bf16(float* x, int64_t n) { round_bf16_inplace(x, n, pool_); }
void CpuExecutor::copy_round_bf16(const float* in, float* out, int64_t n) { olmoref::copy_round_bf16(in, out, n, pool_); }
void CpuExecutor::tree_add(float* dst, const float* src, int64_t n) { olmoref::tree_add(dst, src, n, pool_); }
void CpuExecutor::grad_norm_chunks(const float* grad, int64_t n, double* out) {
  olmoref::grad_norm_chunks(grad, n, 0, (n + kNormChunk - 1) / kNormChunk, out, pool_);
}
void CpuExecutor::scale(float* x, float c, int64_t n) { scale_inplace(x, n, c, pool_); }
int64_t CpuExecutor::count_zeros(const float* x, int64_t n) { return olmoref::count_zeros(x, n, pool_); }
void CpuExecutor::adamw(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
                        int64_t n) {
  adamw_elements(s, decay, grad, p, m, v, n, pool_);
}
void CpuExecutor::moe_route(const float* logits, int64_t R, int64_t E, int64_t k, int normalize_p, float* scores,
                            float* lse, int32_t* top, float* weight) {
  moe::route(logits, R, E, k, scores, lse, top, weight, pool_, normalize_p);
}
void CpuExecutor::moe_combine_backward(const MoEDispatch& plan, const float* dout, const float* y, const float* weight,
                                       float* dy, float* dweight, int64_t d) {
  moe::combine_backward(dout, y, weight, plan, d, dy, dweight, pool_);
}
void CpuExecutor::moe_router_backward(const MoERouterBackward& a, float* dlogits) {
  moe::router_backward(a, dlogits, pool_);
}
void CpuExecutor::moe_dispatch(const MoEDispatch& plan, const float* x, float* xg, int64_t d) {
  moe::gather(x, plan, d, xg, pool_);
}
void CpuExecutor::moe_combine(const MoEDispatch& plan, const float* y, const float* weight, float* out, int64_t d) {
  moe::combine(y, weight, plan, d, out, pool_);
}
void CpuExecutor::moe_scatter_add(const MoEDispatch& plan, const float* dxg, float* dx, int64_t d) {
  moe::scatter_add(dxg, plan, d, dx, pool_);
}
void CpuExecutor::moe_shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n) {
  moe::shared_combine(shared, routed, k, out, n, pool_);
}
void CpuExecutor::moe_shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted, int64_t n) {
  moe::shared_combine_backward(dout, k, dshared, drouted, n, pool_);
}
void CpuExecutor::skip_step_adamw(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v,
                                  int64_t n) {
  skip_step_elements(s, grad, p, m, v, n, pool_);
}

}  // namespace olmoref
