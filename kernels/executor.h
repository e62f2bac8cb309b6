// kernels/executor.h — the CUDA exact executor: core/executor.h's ops as the kernels of kernels/*.h.
//
// One class, two ways to run the same kernels: on the device (executor "cuda": device memory, CUDA launches)
// or executed on the host (executor "cuda-host": host memory, each kernel's blocks run thread by thread
// between barriers, kernels/block.h). Everything but the launch and the memory calls is shared, so CI, which
// has no GPU, trains whole runs through the kernels' real decompositions and compares them with the CPU
// reference's golden traces.
#pragma once

#include "core/executor.h"

namespace olmoref::kernels {

struct GemmArgs;  // kernels/gemm_exact.h

class KernelExecutor final : public Executor {
 public:
  // on_device: false runs the kernels on the host. true needs a CUDA build and a device (make_executor checks).
  explicit KernelExecutor(bool on_device);
  ~KernelExecutor() override;

  std::string name() const override { return on_device_ ? "cuda" : "cuda-host"; }
  // False in both modes: cuda-host's memory is host memory standing in for the device's, and the model and
  // trainer reach it only through to_device / to_host / copy as they do on the device, so CI takes those paths.
  bool host_memory() const override { return false; }
  OLMOREF_EXECUTOR_OPS(, override)
  void synchronize() override;
  bool staging_pinned() const override { return on_device_; }
  int64_t memory_available() const override;
  // Bytes of kernel scratch held now (every workspace buffer, grown to the largest call so far).
  int64_t workspace_bytes() const;
  // TEST ONLY negative control: every GEMM splits K into slabs added afterwards (GemmArgs::debug_split_k). The split
  // exists in the host execution only (the device kernel has no such path): on the device it is refused, never
  // silently ignored, so a control that cannot fail there is not mistaken for one that passed.
  void set_debug_split_k(bool on);

 protected:
  // On the device: page-locked (kernels::pinned_allocate); in the host execution: ordinary host memory.
  void* staging_allocate(size_t bytes, const char* what) override;
  void staging_free(void* p, size_t bytes) override;

 private:
  void gemm(GemmArgs g);  // the exact GEMM, on the device or executed on the host
  template <class Op>
  void elements(const Op& op, int64_t n);
  template <class T>
  T* workspace(Buffer<T>& b, int64_t n, const char* what);

  bool on_device_;
  bool debug_split_k_ = false;
  // Kernel scratch, grown to the largest call: attention's rows of scores [32 per forward block, T], D [B, H, T]
  // and per-head dk/dv [B, H, T, hd]; the loss's fp64 row terms [R] and instance totals [B], norm chunk totals, the
  // embedding position order.
  Buffer<float> att_rows_, att_row_d_, att_dk_head_, att_dv_head_;
  Buffer<double> ce_terms_, z_terms_, norm_chunks_, zero_chunks_;
  Buffer<int64_t> emb_start_, emb_order_;
};

// The attention workspace of a shape: score rows [32·min(B·H·ceil(T/32), kAttentionTileBlocks), T], D [B, H, T] and per-head
// dk/dv [B, H, T, hd], in bytes; linear in T (the memory estimate of model/olmo3.cpp counts it).
int64_t attention_workspace_bytes(int64_t B, int64_t H, int64_t T, int64_t hd);

}  // namespace olmoref::kernels
