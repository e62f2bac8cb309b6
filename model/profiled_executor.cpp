#include "model/profiled_executor.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace olmoref {

template <class F>
void ProfiledExecutor::timed(const char* op, double flops, F&& f) {
  inner_->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f(*inner_);
  inner_->synchronize();
  Stat& s = stats_[op];
  ++s.calls;
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.flops += flops;
}

std::string ProfiledExecutor::report() const {
  std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0.0;
  for (const auto& r : rows) total += r.second.seconds;
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-24s %10s %10s %7s %10s %16s\n", ("op (" + name() + ")").c_str(), "calls",
                "seconds", "share", "GFLOP/s", "FLOP");
  out += line;
  for (const auto& [op, s] : rows) {
    if (s.flops > 0)
      std::snprintf(line, sizeof line, "%-24s %10lld %10.4f %6.1f%% %10.1f %16.0f\n", op.c_str(),
                    static_cast<long long>(s.calls), s.seconds, 100.0 * s.seconds / total, s.flops / s.seconds / 1e9,
                    s.flops);
    else
      std::snprintf(line, sizeof line, "%-24s %10lld %10.4f %6.1f%% %10s\n", op.c_str(), static_cast<long long>(s.calls),
                    s.seconds, 100.0 * s.seconds / total, "-");
    out += line;
  }
  std::snprintf(line, sizeof line, "%-24s %10s %10.4f %6.1f%%\n", "total (timed ops)", "", total, 100.0);
  out += line;
  return out;
}

double attention_query_pairs(const AttentionShape& s, int64_t q0, int64_t q1) {
  double keys = 0.0;  // Σ over query positions of the keys each sees
  for (int64_t i = q0; i < q1; ++i) keys += static_cast<double>(s.window > 0 ? std::min<int64_t>(i + 1, s.window) : i + 1);
  return keys * static_cast<double>(s.B * s.H);
}

double attention_key_pairs(const AttentionShape& s, int64_t k0, int64_t k1) {
  double queries = 0.0;  // Σ over key positions of the queries that see each
  for (int64_t j = k0; j < k1; ++j)
    queries += static_cast<double>(s.window > 0 ? std::min<int64_t>(s.T - j, s.window) : s.T - j);
  return queries * static_cast<double>(s.B * s.H);
}

double attention_keys(const AttentionShape& s) { return attention_query_pairs(s, 0, s.T); }

void* ProfiledExecutor::allocate(size_t bytes, const std::string& what) { return inner_->allocate(bytes, what); }
void ProfiledExecutor::deallocate(void* p) { inner_->deallocate(p); }
void ProfiledExecutor::to_device(void* dst, const void* src, size_t bytes) {
  timed("copy to device", 0, [&](Executor& e) { e.to_device(dst, src, bytes); });
}
void ProfiledExecutor::to_host(void* dst, const void* src, size_t bytes) {
  timed("copy to host", 0, [&](Executor& e) { e.to_host(dst, src, bytes); });
}
void ProfiledExecutor::copy(void* dst, const void* src, size_t bytes) {
  timed("copy", 0, [&](Executor& e) { e.copy(dst, src, bytes); });
}
void ProfiledExecutor::zero(void* dst, size_t bytes) {
  timed("zero", 0, [&](Executor& e) { e.zero(dst, bytes); });
}
void ProfiledExecutor::matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K) {
  timed("matmul_forward", 2.0 * M * N * K, [&](Executor& e) { e.matmul_forward(X, W, Y, M, N, K); });
}
void ProfiledExecutor::matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N,
                                             int64_t K, bool accumulate) {
  timed("matmul_backward_input", 2.0 * M * N * K,
        [&](Executor& e) { e.matmul_backward_input(dY, W, dX, M, N, K, accumulate); });
}
void ProfiledExecutor::matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N,
                                              int64_t K, bool accumulate) {
  timed("matmul_backward_weight", 2.0 * M * N * K,
        [&](Executor& e) { e.matmul_backward_weight(dY, X, dW, M, N, K, accumulate); });
}
void ProfiledExecutor::matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a,
                                             int64_t M, int64_t N, int64_t K, bool bf16) {
  timed("matmul_forward+swiglu", 2.0 * M * N * K,
        [&](Executor& e) { e.matmul_forward_swiglu(X, W3, g, u, a, M, N, K, bf16); });
}
void ProfiledExecutor::matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u,
                                                    float* dg, float* du, int64_t M, int64_t N, int64_t K, bool bf16) {
  timed("matmul_bwd_input+swiglu", 2.0 * M * N * K,
        [&](Executor& e) { e.matmul_backward_input_swiglu(dY, W2, g, u, dg, du, M, N, K, bf16); });
}
void ProfiledExecutor::rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n,
                                       float eps) {
  timed("rmsnorm_forward", 0, [&](Executor& e) { e.rmsnorm_forward(x, w, y, inv_rms, R, n, eps); });
}
void ProfiledExecutor::rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy,
                                        float* dx, float* dw, int64_t R, int64_t n, bool accumulate) {
  timed("rmsnorm_backward", 0, [&](Executor& e) { e.rmsnorm_backward(x, w, inv_rms, dy, dx, dw, R, n, accumulate); });
}
void ProfiledExecutor::rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out,
                                                float* inv_rms, int64_t R, int64_t n, float eps, bool bf16) {
  timed("rmsnorm_residual_forward", 0,
        [&](Executor& e) { e.rmsnorm_residual_forward(res, x, w, out, inv_rms, R, n, eps, bf16); });
}
void ProfiledExecutor::rmsnorm_rope_forward(const float* x_raw, const float* w, float* y, float* inv_rms, int64_t R,
                                            int64_t n_heads, const RopeView& rope, float eps, bool bf16) {
  timed("rmsnorm_rope_forward", 0,
        [&](Executor& e) { e.rmsnorm_rope_forward(x_raw, w, y, inv_rms, R, n_heads, rope, eps, bf16); });
}
void ProfiledExecutor::rope_rmsnorm_backward(const float* x_raw, const float* w, const float* inv_rms, float* dy,
                                             float* dx, float* dw, int64_t R, int64_t n_heads, const RopeView& rope,
                                             bool bf16, bool accumulate) {
  timed("rope_rmsnorm_backward", 0, [&](Executor& e) {
    e.rope_rmsnorm_backward(x_raw, w, inv_rms, dy, dx, dw, R, n_heads, rope, bf16, accumulate);
  });
}
void ProfiledExecutor::rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeView& rope) {
  timed("rope_forward", 0, [&](Executor& e) { e.rope_forward(x, rows, n_heads, rope); });
}
void ProfiledExecutor::rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeView& rope) {
  timed("rope_backward", 0, [&](Executor& e) { e.rope_backward(dx, rows, n_heads, rope); });
}
void ProfiledExecutor::swiglu_forward(const float* g, const float* u, float* a, int64_t n, bool bf16) {
  timed("swiglu_forward", 0, [&](Executor& e) { e.swiglu_forward(g, u, a, n, bf16); });
}
void ProfiledExecutor::swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du,
                                       int64_t n, bool bf16) {
  timed("swiglu_backward", 0, [&](Executor& e) { e.swiglu_backward(g, u, da, dg, du, n, bf16); });
}
void ProfiledExecutor::attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                         float* out, float* row_max, float* row_sum) {
  timed("attention_forward", 4.0 * attention_query_pairs(s, s.q_begin, s.query_end()) * s.hd,
        [&](Executor& e) { e.attention_forward(s, q, k, v, out, row_max, row_sum); });
}
void ProfiledExecutor::attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                          const float* out, const float* row_max, const float* row_sum,
                                          const float* dout, float* dq, float* dk, float* dv) {
  const double pairs = attention_query_pairs(s, s.q_begin, s.query_end()) + attention_key_pairs(s, s.k_begin, s.key_end());
  timed("attention_backward", 4.0 * pairs * s.hd,
        [&](Executor& e) { e.attention_backward(s, q, k, v, out, row_max, row_sum, dout, dq, dk, dv); });
}
void ProfiledExecutor::embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  timed("embedding_forward", 0, [&](Executor& e) { e.embedding_forward(table, tokens, x, R, d); });
}
void ProfiledExecutor::embedding_backward(const uint32_t* host_tokens, const float* dx, float* dtable, int64_t R,
                                          int64_t V, int64_t d, bool accumulate) {
  timed("embedding_backward", 0,
        [&](Executor& e) { e.embedding_backward(host_tokens, dx, dtable, R, V, d, accumulate); });
}
void ProfiledExecutor::cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T,
                                          int64_t V, float z_coef, int64_t global_n_targets, double* ce_terms,
                                          double* z_terms) {
  timed("cross_entropy", 0, [&](Executor& e) {
    e.cross_entropy_rows(logits, tokens, t0, rows, T, V, z_coef, global_n_targets, ce_terms, z_terms);
  });
}
void ProfiledExecutor::add(const float* a, const float* b, float* out, int64_t n) {
  timed("add (residual)", 0, [&](Executor& e) { e.add(a, b, out, n); });
}
void ProfiledExecutor::round_bf16(float* x, int64_t n) {
  timed("round_bf16", 0, [&](Executor& e) { e.round_bf16(x, n); });
}
void ProfiledExecutor::copy_round_bf16(const float* in, float* out, int64_t n) {
  timed("copy_round_bf16", 0, [&](Executor& e) { e.copy_round_bf16(in, out, n); });
}
void ProfiledExecutor::tree_add(float* dst, const float* src, int64_t n) {
  timed("tree_add", 0, [&](Executor& e) { e.tree_add(dst, src, n); });
}
void ProfiledExecutor::grad_norm_chunks(const float* grad, int64_t n, double* out) {
  timed("grad_norm_chunks", 0, [&](Executor& e) { e.grad_norm_chunks(grad, n, out); });
}
void ProfiledExecutor::scale(float* x, float c, int64_t n) {
  timed("scale (clip)", 0, [&](Executor& e) { e.scale(x, c, n); });
}
int64_t ProfiledExecutor::count_zeros(const float* x, int64_t n) {
  int64_t zeros = 0;
  timed("count_zeros", 0, [&](Executor& e) { zeros = e.count_zeros(x, n); });
  return zeros;
}
void ProfiledExecutor::adamw(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
                             int64_t n) {
  timed("adamw", 0, [&](Executor& e) { e.adamw(s, decay, grad, p, m, v, n); });
}
void ProfiledExecutor::moe_route(const float* logits, int64_t R, int64_t E, int64_t k, int normalize_p, float* scores,
                                 float* lse, int32_t* top, float* weight) {
  timed("moe_route", 0, [&](Executor& e) { e.moe_route(logits, R, E, k, normalize_p, scores, lse, top, weight); });
}
void ProfiledExecutor::moe_combine_backward(const MoEDispatch& plan, const float* dout, const float* y,
                                            const float* weight, float* dy, float* dweight, int64_t d) {
  timed("moe_combine_backward", 0, [&](Executor& e) { e.moe_combine_backward(plan, dout, y, weight, dy, dweight, d); });
}
void ProfiledExecutor::moe_router_backward(const MoERouterBackward& a, float* dlogits) {
  timed("moe_router_backward", 0, [&](Executor& e) { e.moe_router_backward(a, dlogits); });
}
void ProfiledExecutor::moe_dispatch(const MoEDispatch& plan, const float* x, float* xg, int64_t d) {
  timed("moe_dispatch", 0, [&](Executor& e) { e.moe_dispatch(plan, x, xg, d); });
}
void ProfiledExecutor::moe_combine(const MoEDispatch& plan, const float* y, const float* weight, float* out, int64_t d) {
  timed("moe_combine", 0, [&](Executor& e) { e.moe_combine(plan, y, weight, out, d); });
}
void ProfiledExecutor::moe_scatter_add(const MoEDispatch& plan, const float* dxg, float* dx, int64_t d) {
  timed("moe_scatter_add", 0, [&](Executor& e) { e.moe_scatter_add(plan, dxg, dx, d); });
}
void ProfiledExecutor::moe_shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n) {
  timed("moe_shared_combine", 0, [&](Executor& e) { e.moe_shared_combine(shared, routed, k, out, n); });
}
void ProfiledExecutor::moe_shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted,
                                                   int64_t n) {
  timed("moe_shared_combine_backward", 0, [&](Executor& e) { e.moe_shared_combine_backward(dout, k, dshared, drouted, n); });
}
void ProfiledExecutor::skip_step_adamw(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v,
                                       int64_t n) {
  timed("skip_step_adamw", 0, [&](Executor& e) { e.skip_step_adamw(s, grad, p, m, v, n); });
}

}  // namespace olmoref
