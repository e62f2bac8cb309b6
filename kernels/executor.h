// kernels/executor.h — the CUDA exact executor: model/executor.h's ops as the kernels of kernels/*.h.
//
// One class, two ways to run the same kernels: on the device (executor "cuda": device memory, CUDA launches)
// or executed on the host (executor "cuda-host": host memory, each kernel's blocks run thread by thread
// between barriers, kernels/block.h). Everything but the launch and the memory calls is shared, so CI, which
// has no GPU, trains whole runs through the kernels' real decompositions and compares them with the CPU
// reference's golden traces.
#pragma once

#include "model/executor.h"

namespace olmoref::kernels {

class KernelExecutor final : public Executor {
 public:
  // on_device: false runs the kernels on the host. true needs a CUDA build and a device (make_executor checks).
  explicit KernelExecutor(bool on_device);
  ~KernelExecutor() override;

  std::string name() const override { return on_device_ ? "cuda" : "cuda-host"; }
  // False in both modes: cuda-host's memory is host memory standing in for the device's, and the model and
  // trainer reach it only through to_device / to_host / copy as they do on the device, so CI takes those paths.
  bool host_memory() const override { return false; }
  void* allocate(size_t bytes, const std::string& what) override;
  void deallocate(void* p) override;
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
  void synchronize() override;
  int64_t memory_available() const override;
  // TEST ONLY negative control: every GEMM splits K into slabs added afterwards (GemmArgs::debug_split_k).
  void set_debug_split_k(bool on) { debug_split_k_ = on; }

 private:
  template <class Op>
  void elements(const Op& op, int64_t n);
  template <class T>
  T* workspace(Buffer<T>& b, int64_t n, const char* what);

  bool on_device_;
  bool debug_split_k_ = false;
  // Kernel scratch, grown to the largest call: attention P and dS [B·H·T, T], per-head dk/dv [B, H, T, hd],
  // the loss's fp64 row terms [R] and instance totals [B], norm chunk totals, the embedding position order.
  Buffer<float> att_p_, att_ds_, att_dk_head_, att_dv_head_;
  Buffer<double> ce_terms_, z_terms_, ce_total_, z_total_, norm_chunks_;
  Buffer<int64_t> emb_start_, emb_order_;
};

}  // namespace olmoref::kernels
