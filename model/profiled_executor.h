// model/profiled_executor.h — an executor that times every op of another (train --profile-ops): each op waits for
// the device before and after (so the time is the op's own), and the report gives per op calls, seconds, share of
// the timed total and, where the op's arithmetic is counted, GFLOP/s. The timing changes no value: the wrapped
// executor computes exactly what it computes unwrapped.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "model/executor.h"

namespace olmoref {

class ProfiledExecutor final : public Executor {
 public:
  explicit ProfiledExecutor(std::unique_ptr<Executor> inner) : inner_(std::move(inner)) {}
  Executor& inner() { return *inner_; }
  // One table, one line per op, heaviest first.
  std::string report() const;

  std::string name() const override { return inner_->name(); }
  bool host_memory() const override { return inner_->host_memory(); }
  void* allocate(size_t bytes, const std::string& what) override { return inner_->allocate(bytes, what); }
  void deallocate(void* p) override { inner_->deallocate(p); }
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;

  void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K) override;
  void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                             bool accumulate) override;
  void matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,
                              bool accumulate) override;
  void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n,
                       float eps) override;
  void rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, float* dw,
                        int64_t R, int64_t n) override;
  void rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeView& rope) override;
  void rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeView& rope) override;
  void swiglu_forward(const float* g, const float* u, float* a, int64_t n, bool bf16) override;
  void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                       bool bf16) override;
  void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                         float* row_max, float* row_sum) override;
  void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                          const float* row_max, const float* row_sum, const float* dout, float* dq, float* dk,
                          float* dv) override;
  void embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) override;
  void embedding_backward(const uint32_t* host_tokens, const float* dx, float* dtable, int64_t R, int64_t V,
                          int64_t d) override;
  void cross_entropy(float* logits, const uint32_t* tokens, int64_t B, int64_t T, int64_t V, float z_coef,
                     int64_t global_n_targets, LossSums* per_instance) override;
  void add(const float* a, const float* b, float* out, int64_t n) override;
  void round_bf16(float* x, int64_t n) override;
  void copy_round_bf16(const float* in, float* out, int64_t n) override;
  void tree_add(float* dst, const float* src, int64_t n) override;
  void grad_norm_chunks(const float* grad, int64_t n, double* out) override;
  void scale(float* x, float c, int64_t n) override;
  void adamw(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
             int64_t n) override;
  void synchronize() override { inner_->synchronize(); }

 private:
  struct Stat {
    int64_t calls = 0;
    double seconds = 0.0, flops = 0.0;
  };
  // Runs f on the inner executor, timed between two synchronizations.
  template <class F>
  void timed(const char* op, double flops, F&& f);

  std::unique_ptr<Executor> inner_;
  std::map<std::string, Stat> stats_;
};

// FLOPs of attention over B·H·T query rows of a causal band (window 0 = full): the score and P·V products,
// 4·hd per key in forward and 8·hd per key in backward (dP, dS·K, dS^T·Q, P^T·dO).
double attention_keys(const AttentionShape& s);

}  // namespace olmoref
