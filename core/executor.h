// core/executor.h — the op table: every operation the Olmo 3 step performs, as one interface with two
// implementations, op for op with the same names and shapes: ref/cpu_executor.h (the CPU reference, ref/) and
// kernels/executor.h (the CUDA exact kernels, kernels/). The model (model/olmo3.h), the instance tree
// (model/gradient_tree.h) and the trainer's step are written once over it. docs/canonical/README.md lists
// the same table with each op's order.
//
// Memory: every float*/uint32_t* an op receives is executor memory (device memory for CUDA), obtained from
// allocate() or a Buffer. Host data crosses only through to_device / to_host, and the few arguments marked
// "host" below. Shapes as in ref/ops.h (the CPU definitions): R rows (instances · T), n a row width, V the
// vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/elementwise.h"
#include "core/op_types.h"

namespace olmoref {

// RoPE tables in executor memory: cos, sin [T, hd/2].
struct RopeView {
  int64_t seq_len = 0, head_dim = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  // Intra-document masking: each row's position in its document, [rows] in executor memory (elem::rope_position);
  // null: row r at r % seq_len.
  const int32_t* positions = nullptr;
};

// The op table, written once: OLMOREF_EXECUTOR_OPS(PRE, POST) declares every op as `PRE <signature> POST;`. The
// interface below is OLMOREF_EXECUTOR_OPS(virtual, = 0); each executor declares OLMOREF_EXECUTOR_OPS(, override).
#define OLMOREF_EXECUTOR_OPS(PRE, POST) \
  /* ---- memory ---- */                                                                                             \
  /* `what` names the tensor in the out-of-memory error, which also gives the size and a remedy. */                  \
  PRE void* allocate(size_t bytes, const std::string& what) POST;                                                    \
  PRE void deallocate(void* p) POST;                                                                                 \
  PRE void to_device(void* dst, const void* host_src, size_t bytes) POST;                                            \
  PRE void to_host(void* host_dst, const void* src, size_t bytes) POST;                                              \
  PRE void copy(void* dst, const void* src, size_t bytes) POST;  /* executor memory to executor memory */            \
  PRE void zero(void* dst, size_t bytes) POST;                                                                       \
  /* ---- linear layers (ref/gemm.h; docs/canonical/matmul.md) ---- */                                               \
  PRE void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K) POST;           \
  PRE void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,        \
                                 bool accumulate) POST;                                                              \
  PRE void matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,       \
                                  bool accumulate) POST;                                                             \
  /* SwiGLU fused into its products as GEMM epilogues (ref/ops.h): exactly the unfused sequence. */                  \
  /* u [M,N] = X [M,K]·W3 [N,K]ᵀ (bf16: rounded); a [M,N] = SwiGLU(g, u). */                                         \
  PRE void matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a, int64_t M,     \
                                 int64_t N, int64_t K, bool bf16) POST;                                              \
  /* da [M,K] = dY [M,N]·W2 [N,K] (bf16: rounded), held in dg; dg, du [M,K] = SwiGLU backward of (g, u, da). */      \
  PRE void matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u, float* dg, \
                                        float* du, int64_t M, int64_t N, int64_t K, bool bf16) POST;                 \
  /* ---- RMSNorm / QK-norm, RoPE, SwiGLU, attention, embedding (ref/ops.h) ---- */                                  \
  PRE void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n,           \
                           float eps) POST;                                                                          \
  /* accumulate: dw's chains (over rows, in order) continue from its values instead of starting at +0, so a */    \
  /* reduction over an instance's rows split in runs (context parallelism's ranks) gives the whole's bits. */       \
  PRE void rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx,        \
                            float* dw, int64_t R, int64_t n, bool accumulate) POST;                                  \
  /* Fused forms: bit for bit the unfused sequences they replace, each round a round_bf16 in bf16 only */            \
  /* (docs/canonical/norm-rope-swiglu.md). out [R, n] = res [R, n] + RMSNorm(x [R, n]): */                           \
  /* rmsnorm_forward; round; add(res, ·); round. out may be res. */                                                  \
  PRE void rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out, float* inv_rms,    \
                                    int64_t R, int64_t n, float eps, bool bf16) POST;                                \
  /* y [R, n_heads·hd] = RoPE(RMSNorm(x_raw)), the norm over the full width (QK-norm): */                            \
  /* rmsnorm_forward; round; rope_forward; round. inv_rms [R] saved as rmsnorm_forward saves it. */                  \
  PRE void rmsnorm_rope_forward(const float* x_raw, const float* w, float* y, float* inv_rms, int64_t R,             \
                                int64_t n_heads, const RopeView& rope, float eps, bool bf16) POST;                   \
  /* Its backward: dy [R, n_heads·hd] rotated back in place (rope_backward; round), then dx [R, n] and dw [n] */     \
  /* as rmsnorm_backward on that dy (which the weight gradient reads too, so it stays in dy). */                     \
  PRE void rope_rmsnorm_backward(const float* x_raw, const float* w, const float* inv_rms, float* dy, float* dx,     \
                                 float* dw, int64_t R, int64_t n_heads, const RopeView& rope, bool bf16,             \
                                 bool accumulate) POST;                                                              \
  PRE void rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeView& rope) POST;                         \
  PRE void rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeView& rope) POST;                       \
  PRE void swiglu_forward(const float* g, const float* u, float* a, int64_t n, bool bf16) POST;                      \
  PRE void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,         \
                           bool bf16) POST;                                                                          \
  PRE void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,    \
                             float* row_max, float* row_sum) POST;                                                   \
  PRE void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,               \
                              const float* out, const float* row_max, const float* row_sum, const float* dout,       \
                              float* dq, float* dk, float* dv) POST;                                                 \
  PRE void embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) POST;       \
  /* host_tokens: the same R tokens in host memory (the fixed position order is made from them on the host). */      \
  /* accumulate: each row's adds continue from dtable's values instead of +0 (as rmsnorm_backward's dw). */          \
  PRE void embedding_backward(const uint32_t* host_tokens, const float* dx, float* dtable, int64_t R, int64_t V,     \
                              int64_t d, bool accumulate) POST;                                                      \
  /* ---- mixture of experts (docs/canonical/moe.md; ref/moe.h) ---- */                                             \
  /* scores [R, E] = softmax(logits [R, E]), lse [R] its log-sum-exp, top [R, k] the k best experts in rank */     \
  /* order (ties to the lower index), weight [R, k] their scores, normalised by L1 / L2 with normalize_p 1 / 2. */    \
  PRE void moe_route(const float* logits, int64_t R, int64_t E, int64_t k, int normalize_p, float* scores,          \
                     float* lse, int32_t* top, float* weight) POST;                                                  \
  /* xg [S, d]: position p holds x [R, d]'s row row_of[p] (data movement). */                                      \
  PRE void moe_dispatch(const MoEDispatch& plan, const float* x, float* xg, int64_t d) POST;                          \
  /* out [R, d]: row r = Σ_j weight [R, k][r, j] · y [S, d][position(r, j)], one fma chain over j from 0. */        \
  PRE void moe_combine(const MoEDispatch& plan, const float* y, const float* weight, float* out, int64_t d) POST;    \
  /* dx [R, d] row r = ((dx[r] + dxg [S, d][position(r, 0)]) + dxg[position(r, 1)]) + ..., j in order. */         \
  /* moe_combine's backward: dy [S, d] at position(r, j) = weight[r, j] · dout [R, d][r]; */                        \
  /* dweight [R, k][r, j] = canonical_dot(dout[r], y [S, d][position(r, j)]) over d. */                             \
  PRE void moe_combine_backward(const MoEDispatch& plan, const float* dout, const float* y, const float* weight,    \
                                float* dy, float* dweight, int64_t d) POST;                                          \
  PRE void moe_scatter_add(const MoEDispatch& plan, const float* dxg, float* dx, int64_t d) POST;                    \
  /* dlogits [R, E] from the routing, ∂weight, the load-balancing and z-loss terms (core/op_types.h; ref/moe.h). */ \
  PRE void moe_router_backward(const MoERouterBackward& a, float* dlogits) POST;                                     \
  /* out [n] = shared / (k+1) + routed · fl32(k/(k+1)), each op rounded; out may be routed. Its backward: */       \
  /* dshared = dout / (k+1), drouted = dout · fl32(k/(k+1)). */                                                    \
  PRE void moe_shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n) POST;      \
  PRE void moe_shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted, int64_t n)     \
      POST;                                                                                                          \
  /* ---- loss (docs/canonical/loss.md) ---- */                                                                      \
  /* Positions [t0, t0 + rows) of one instance: their logits [rows, V] become ∂loss/∂logits and (host) ce_terms, */ \
  /* z_terms [rows] receive the rows' fp64 terms. tokens [T] are the instance's (executor memory); position t */    \
  /* predicts tokens[t + 1], T − 1 none. Rows are independent, so an instance may come in any split into runs; */   \
  /* the model sums each instance's T terms (docs/canonical/loss.md). */                                             \
  PRE void cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T, int64_t V, \
                              float z_coef, int64_t global_n_targets, double* ce_terms, double* z_terms) POST;       \
  /* ---- elementwise ---- */                                                                                        \
  PRE void add(const float* a, const float* b, float* out, int64_t n) POST;  /* out = a + b (residuals) */           \
  PRE void round_bf16(float* x, int64_t n) POST;                                                                     \
  PRE void copy_round_bf16(const float* in, float* out, int64_t n) POST;                                             \
  /* ---- the step (docs/canonical/step.md) ---- */                                                                  \
  PRE void tree_add(float* dst, const float* src, int64_t n) POST;  /* dst = dst + src */                            \
  /* Σg² of each kNormChunk-float chunk of grad [0, n) (grad starts at a chunk boundary of the flat vector) into */  \
  /* out (host) [ceil(n / kNormChunk)], by the canonical fp64 row reduction. */                                      \
  PRE void grad_norm_chunks(const float* grad, int64_t n, double* out) POST;                                         \
  PRE void scale(float* x, float c, int64_t n) POST;  /* x = x · c */                                                \
  /* Elements of x [0, n) equal to zero (-0 included), as Megatron's num-zeros counts the clipped gradient. */       \
  PRE int64_t count_zeros(const float* x, int64_t n) POST;                                                           \
  /* AdamW on one tensor's elements [0, n) (core/elementwise.h adamw); decay is 1 for tensors without decay. */       \
  PRE void adamw(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,          \
                 int64_t n) POST;                                                                                   \
  /* SkipStepAdamW on one group's elements [0, n) (core/elementwise.h skip_step_adamw): the scalars of */            \
  /* core/skip_step.h skip_step_scalars carry the group's lr, decay and the step factor (0: a skipped step). */     \
  PRE void skip_step_adamw(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v,         \
                           int64_t n) POST;

class Executor {
 public:
  virtual ~Executor() = default;
  // "cpu", "cuda" or "cuda-host" (the CUDA kernels' decompositions executed on the host: the CI check).
  virtual std::string name() const = 0;
  // True when executor memory is ordinary host memory (pointers may be read and written by the host).
  virtual bool host_memory() const = 0;

  OLMOREF_EXECUTOR_OPS(virtual, = 0)

  // Waits for queued work (device executors); the host's copies already wait.
  virtual void synchronize() {}
  // Bytes that can still be allocated (device: free device memory; host: the kernel's MemAvailable), or -1 when
  // unknown. Used to refuse a run that will not fit before anything is allocated.
  virtual int64_t memory_available() const;
  // Host memory that stages a data exchange between executor memory and MPI (dist/): on a device, page-locked, so
  // that to_host / to_device move it at the link's full rate by DMA instead of through the driver's bounce buffer.
  // Elsewhere ordinary host memory. Making it costs more than malloc on a device (it is pinned and mapped), so the
  // exchanges keep theirs for a step. `what` names it in the out-of-memory error. From the main thread only.
  void* allocate_staging(size_t bytes, const char* what);
  void free_staging(void* p, size_t bytes);
  virtual bool staging_pinned() const { return false; }
  // What the staging cost so far: blocks made, and the bytes held now and at most (`train --report-comm`).
  struct StagingStats {
    int64_t allocations = 0, live_bytes = 0, peak_bytes = 0;
  };
  const StagingStats& staging_stats() const { return staging_; }

 protected:
  virtual void* staging_allocate(size_t bytes, const char* what);
  virtual void staging_free(void* p, size_t bytes);

 private:
  StagingStats staging_;
};

// Anonymous zero pages of `bytes` (no memory until written); `what` names the allocation in the error.
void* host_map_zeroed(size_t bytes, const std::string& what);
void host_unmap(void* p, size_t bytes);
// Bytes of [p, p + bytes) whose pages are resident (the whole pages the range touches).
int64_t host_resident_bytes(const void* p, size_t bytes);

// A typed allocation in executor memory, freed with its owner; zero-filled.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Executor& ex, int64_t n, const std::string& what) { reset(ex, n, what); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      free();
      ex_ = o.ex_, p_ = o.p_, n_ = o.n_, mapped_ = o.mapped_;
      o.p_ = nullptr, o.n_ = 0, o.mapped_ = false;
    }
    return *this;
  }
  ~Buffer() { free(); }

  void reset(Executor& ex, int64_t n, const std::string& what) {
    free();
    ex_ = &ex;
    n_ = n;
    if (n > 0) {
      p_ = static_cast<T*>(ex.allocate(static_cast<size_t>(n) * sizeof(T), what));
      ex.zero(p_, static_cast<size_t>(n) * sizeof(T));
    }
  }
  // The same, but in host memory the pages are mapped zero and left untouched, so only the parts ever written take
  // memory (expert-resident state: a rank writes only what it holds). Device memory: as reset.
  void reset_untouched(Executor& ex, int64_t n, const std::string& what) {
    if (!ex.host_memory()) return reset(ex, n, what);
    free();
    ex_ = &ex;
    n_ = n;
    if (n > 0) p_ = static_cast<T*>(host_map_zeroed(static_cast<size_t>(n) * sizeof(T), what)), mapped_ = true;
  }
  void free() {
    if (p_ && mapped_)
      host_unmap(p_, static_cast<size_t>(n_) * sizeof(T));
    else if (p_)
      ex_->deallocate(p_);
    p_ = nullptr;
    n_ = 0;
    mapped_ = false;
  }
  // Bytes of this buffer resident in host memory (mincore), or -1 for device memory.
  int64_t resident_bytes() const {
    if (!ex_ || !ex_->host_memory()) return -1;
    return host_resident_bytes(p_, static_cast<size_t>(n_) * sizeof(T));
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  void upload(const T* host, int64_t n, int64_t at = 0) {
    ex_->to_device(p_ + at, host, static_cast<size_t>(n) * sizeof(T));
  }
  void download(T* host, int64_t n, int64_t at = 0) const {
    ex_->to_host(host, p_ + at, static_cast<size_t>(n) * sizeof(T));
  }

 private:
  Executor* ex_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
  bool mapped_ = false;  // reset_untouched's pages, returned by host_unmap
};

// A vector in the executor's staging memory (Executor::allocate_staging): std::vector's semantics (value-initialized
// growth, clear() keeping the capacity), its blocks page-locked on a device.
template <class T>
struct StagingAllocator {
  using value_type = T;
  // A vector moved or swapped takes its blocks' allocator along (a default-made vector's has no executor).
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  Executor* ex = nullptr;
  const char* what = "host staging";
  StagingAllocator() = default;
  StagingAllocator(Executor& e, const char* w) : ex(&e), what(w) {}
  template <class U>
  StagingAllocator(const StagingAllocator<U>& o) : ex(o.ex), what(o.what) {}  // NOLINT: rebinding, as allocators do
  T* allocate(size_t n) { return static_cast<T*>(ex->allocate_staging(n * sizeof(T), what)); }
  void deallocate(T* p, size_t n) { ex->free_staging(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const StagingAllocator<U>& o) const { return ex == o.ex; }
};
template <class T>
using StagingVector = std::vector<T, StagingAllocator<T>>;

// The host's available memory (MemAvailable of /proc/meminfo), -1 when unknown.
int64_t host_memory_available();

// This process's memory and reads so far (/proc/self/status, /proc/self/io), -1 where unknown.
struct ProcessStats {
  int64_t peak_resident = -1;  // the process's peak: VmHWM, or the peak before reset_peak_resident when larger
  int64_t peak_since_reset = -1;  // VmHWM: the peak since the last reset_peak_resident (or the start)
  int64_t resident = -1;       // VmRSS
  int64_t read_chars = -1;     // rchar: bytes read through read/pread, from the page cache or the disk
  int64_t read_bytes = -1;     // read_bytes: bytes fetched from the storage layer
  int64_t write_chars = -1;    // wchar: bytes written through write
};
ProcessStats process_stats();
// Starts a new peak (writes 5 to /proc/self/clear_refs), keeping the old one for peak_resident: what one phase of a
// run (a checkpoint write) takes, measured alone. False where the kernel does not allow it.
bool reset_peak_resident();

}  // namespace olmoref
