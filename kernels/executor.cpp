#include "kernels/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_exact.h"
#include "kernels/device_memory.h"
#include "kernels/elementwise.h"
#include "kernels/gemm_exact.h"
#include "kernels/loss_exact.h"
#include "kernels/moe_exact.h"
#include "kernels/rmsnorm_exact.h"
#include "core/embedding_order.h"
#include "core/optim.h"

// The device calls exist only in a CUDA build; elsewhere a KernelExecutor(true) cannot be made (make_executor
// refuses it at start), so the branch is unreachable.
#if OLMOREF_HAVE_CUDA
#define OLMOREF_DEVICE(call) call
#else
#define OLMOREF_DEVICE(call) no_cuda<decltype(call)>()  // decltype: the device call is named, never linked
#endif

namespace olmoref::kernels {

namespace {
template <class T = void>
[[noreturn]] [[maybe_unused]] T no_cuda() {
  throw std::logic_error("this olmoref was built without CUDA");
}
}  // namespace

KernelExecutor::KernelExecutor(bool on_device) : on_device_(on_device) {
#if !OLMOREF_HAVE_CUDA
  if (on_device) no_cuda();
#endif
}
KernelExecutor::~KernelExecutor() = default;

void KernelExecutor::set_debug_split_k(bool on) {
  if (on && on_device_)
    throw std::invalid_argument("debug_split_k is a negative control of the host execution (cuda-host) only: the "
                                "device's GEMM kernel has no split-K path, so on the device it would be ignored");
  debug_split_k_ = on;
}

void* KernelExecutor::allocate(size_t bytes, const std::string& what) {
  if (on_device_) return OLMOREF_DEVICE(device_allocate(bytes, what));
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  if (!p)
    throw std::runtime_error("out of host memory allocating " + what + " (" + std::to_string(bytes >> 20) +
                             " MiB); try a smaller train.micro_batch_instances");
  return p;
}
void KernelExecutor::deallocate(void* p) {
  if (on_device_) OLMOREF_DEVICE(device_free(p));
  else std::free(p);
}
void* KernelExecutor::staging_allocate(size_t bytes, const char* what) {
  if (on_device_) return OLMOREF_DEVICE(pinned_allocate(bytes, what));
  return Executor::staging_allocate(bytes, what);
}
void KernelExecutor::staging_free(void* p, size_t bytes) {
  if (on_device_) OLMOREF_DEVICE(pinned_free(p));
  else Executor::staging_free(p, bytes);
}
void KernelExecutor::to_device(void* dst, const void* src, size_t bytes) {
  if (on_device_) OLMOREF_DEVICE(host_to_device(dst, src, bytes));
  else std::memcpy(dst, src, bytes);
}
void KernelExecutor::to_host(void* dst, const void* src, size_t bytes) {
  if (on_device_) OLMOREF_DEVICE(device_to_host(dst, src, bytes));
  else std::memcpy(dst, src, bytes);
}
void KernelExecutor::copy(void* dst, const void* src, size_t bytes) {
  if (on_device_) OLMOREF_DEVICE(device_to_device(dst, src, bytes));
  else std::memmove(dst, src, bytes);
}
void KernelExecutor::zero(void* dst, size_t bytes) {
  if (on_device_) OLMOREF_DEVICE(device_zero(dst, bytes));
  else std::memset(dst, 0, bytes);
}
int64_t KernelExecutor::memory_available() const {
  if (on_device_) return OLMOREF_DEVICE(device_free_bytes());
  return host_memory_available();
}
void KernelExecutor::synchronize() {
  if (on_device_) OLMOREF_DEVICE(device_synchronize("the step's kernels"));
}

template <class Op>
void KernelExecutor::elements(const Op& op, int64_t n) {
  if (on_device_) OLMOREF_DEVICE(run_device(op, n));
  else run_host(op, n);
}

template <class T>
T* KernelExecutor::workspace(Buffer<T>& b, int64_t n, const char* what) {
  if (b.size() < n) b.reset(*this, n, what);
  return b.data();
}

int64_t KernelExecutor::workspace_bytes() const {
  const auto bytes = [](const auto&... b) { return ((b.size() * static_cast<int64_t>(sizeof(*b.data()))) + ...); };
  return bytes(att_rows_, att_row_d_, att_dk_head_, att_dv_head_, ce_terms_, z_terms_, norm_chunks_, zero_chunks_,
               emb_start_, emb_order_);
}

// ---- GEMM: the three products of a linear layer as strided views (ref/gemm.h) ----
namespace {
GemmArgs gemm_view(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col, const float* B,
                   int64_t b_row, int64_t b_col, float* C, bool accumulate) {
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = A, g.a_row = a_row, g.a_col = a_col;
  g.B = B, g.b_row = b_row, g.b_col = b_col;
  g.C = C, g.ldc = N, g.accumulate = accumulate;
  return g;
}
}  // namespace

void KernelExecutor::gemm(GemmArgs g) {
  g.debug_split_k = debug_split_k_;
  if (on_device_) OLMOREF_DEVICE(gemm_exact_device(g));
  else gemm_exact_host(g);
}

// Y[M,N] = X[M,K] · W[N,K]ᵀ: B(p, j) = W[j, p].
void KernelExecutor::matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K) {
  gemm(gemm_view(M, N, K, X, K, 1, W, 1, K, Y, false));
}
// dX[M,K] (+)= dY[M,N] · W[N,K]: a product of M x K over N.
void KernelExecutor::matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                                           bool accumulate) {
  gemm(gemm_view(M, K, N, dY, N, 1, W, K, 1, dX, accumulate));
}
// dW[N,K] (+)= dY[M,N]ᵀ · X[M,K]: a product of N x K over the M tokens; A(i, p) = dY[p, i].
void KernelExecutor::matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N,
                                            int64_t K, bool accumulate) {
  gemm(gemm_view(N, K, M, dY, 1, N, X, K, 1, dW, accumulate));
}

// u = X·W3ᵀ and a = SwiGLU(g, u) in the product's store.
void KernelExecutor::matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a,
                                           int64_t M, int64_t N, int64_t K, bool bf16) {
  GemmArgs args = gemm_view(M, N, K, X, K, 1, W3, 1, K, u, false);
  args.epilogue = GemmEpilogueKind::swiglu_forward;
  args.epi_g = g, args.epi_out = a, args.epi_bf16 = bf16;
  gemm(args);
}
// da = dY·W2 [M, K], then dg (in C) and du in the product's store.
void KernelExecutor::matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u,
                                                  float* dg, float* du, int64_t M, int64_t N, int64_t K, bool bf16) {
  GemmArgs args = gemm_view(M, K, N, dY, N, 1, W2, K, 1, dg, false);
  args.epilogue = GemmEpilogueKind::swiglu_backward;
  args.epi_g = g, args.epi_u = u, args.epi_out = du, args.epi_bf16 = bf16;
  gemm(args);
}

// ---- RMSNorm ----
void KernelExecutor::rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n,
                                     float eps) {
  RmsNormArgs a;
  a.R = R, a.n = n, a.x = x, a.w = w, a.y = y, a.inv_rms = inv_rms, a.eps = eps;
  if (on_device_) OLMOREF_DEVICE(rmsnorm_forward_device(a));
  else rmsnorm_forward_host(a);
}
void KernelExecutor::rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out,
                                              float* inv_rms, int64_t R, int64_t n, float eps, bool bf16) {
  RmsNormArgs a;
  a.R = R, a.n = n, a.x = x, a.w = w, a.y = out, a.inv_rms = inv_rms, a.eps = eps, a.res = res, a.bf16 = bf16;
  if (on_device_) OLMOREF_DEVICE(rmsnorm_forward_device(a));
  else rmsnorm_forward_host(a);
}
void KernelExecutor::rmsnorm_rope_forward(const float* x_raw, const float* w, float* y, float* inv_rms, int64_t R,
                                          int64_t n_heads, const RopeView& r, float eps, bool bf16) {
  RmsNormArgs a;
  a.R = R, a.n = n_heads * r.head_dim, a.x = x_raw, a.w = w, a.y = y, a.inv_rms = inv_rms, a.eps = eps;
  a.rope_cos = r.cos, a.rope_sin = r.sin, a.rope_positions = r.positions, a.n_heads = n_heads, a.hd = r.head_dim, a.T = r.seq_len, a.bf16 = bf16;
  if (on_device_) OLMOREF_DEVICE(rmsnorm_forward_device(a));
  else rmsnorm_forward_host(a);
}
void KernelExecutor::rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx,
                                      float* dw, int64_t R, int64_t n, bool accumulate) {
  RmsNormArgs a;
  // One argument struct serves forward and backward; backward only reads inv_rms.
  a.R = R, a.n = n, a.x = x, a.w = w, a.inv_rms = const_cast<float*>(inv_rms), a.dy = dy, a.dx = dx, a.dw = dw;
  a.accumulate_dw = accumulate;
  if (on_device_) OLMOREF_DEVICE(rmsnorm_backward_device(a));
  else rmsnorm_backward_host(a);
}

void KernelExecutor::rope_rmsnorm_backward(const float* x_raw, const float* w, const float* inv_rms, float* dy,
                                           float* dx, float* dw, int64_t R, int64_t n_heads, const RopeView& r,
                                           bool bf16, bool accumulate) {
  RmsNormArgs a;
  a.R = R, a.n = n_heads * r.head_dim, a.x = x_raw, a.w = w, a.inv_rms = const_cast<float*>(inv_rms);
  a.dy = dy, a.dy_rope = dy, a.dx = dx, a.dw = dw, a.bf16 = bf16, a.accumulate_dw = accumulate;
  a.rope_cos = r.cos, a.rope_sin = r.sin, a.rope_positions = r.positions, a.n_heads = n_heads, a.hd = r.head_dim, a.T = r.seq_len;
  if (on_device_) OLMOREF_DEVICE(rmsnorm_backward_device(a));
  else rmsnorm_backward_host(a);
}

// ---- RoPE, SwiGLU, embedding, elementwise ----
void KernelExecutor::rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeView& r) {
  elements(RopeOp{x, n_heads, r.head_dim, r.seq_len, r.cos, r.sin, false, r.positions},
           rope_elements(rows, n_heads, r.head_dim));
}
void KernelExecutor::rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeView& r) {
  elements(RopeOp{dx, n_heads, r.head_dim, r.seq_len, r.cos, r.sin, true, r.positions},
           rope_elements(rows, n_heads, r.head_dim));
}
void KernelExecutor::swiglu_forward(const float* g, const float* u, float* a, int64_t n, bool bf16) {
  elements(SwigluForwardOp{g, u, a, bf16}, n);
}
void KernelExecutor::swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                                     bool bf16) {
  elements(SwigluBackwardOp{g, u, da, dg, du, bf16}, n);
}
void KernelExecutor::embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  elements(EmbeddingForwardOp{table, tokens, x, d}, R * d);
}
void KernelExecutor::embedding_backward(const uint32_t* host_tokens, const float* dx, float* dtable, int64_t R,
                                        int64_t V, int64_t d, bool accumulate) {
  // The fixed position order (a stable counting sort) is data preparation: made on the host from the host tokens.
  std::vector<int64_t> start, order;
  embedding_position_order(host_tokens, R, V, start, order);
  int64_t* s = workspace(emb_start_, V + 1, "embedding position starts");
  int64_t* o = workspace(emb_order_, R, "embedding position order");
  to_device(s, start.data(), start.size() * sizeof(int64_t));
  to_device(o, order.data(), order.size() * sizeof(int64_t));
  elements(EmbeddingBackwardOp{s, o, dx, dtable, d, accumulate}, V * d);
}
void KernelExecutor::add(const float* a, const float* b, float* out, int64_t n) { elements(AddOp{a, b, out}, n); }
void KernelExecutor::round_bf16(float* x, int64_t n) { elements(RoundBf16Op{x, x}, n); }
void KernelExecutor::copy_round_bf16(const float* in, float* out, int64_t n) { elements(RoundBf16Op{in, out}, n); }
void KernelExecutor::tree_add(float* dst, const float* src, int64_t n) { elements(AddOp{dst, src, dst}, n); }
void KernelExecutor::scale(float* x, float c, int64_t n) {
  if (c != 1.0f) elements(ScaleOp{x, c}, n);  // as core/optim.h scale_inplace: clip 1 leaves the gradient alone
}
int64_t KernelExecutor::count_zeros(const float* x, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks == 0) return 0;
  ZeroCountArgs a;
  a.x = x, a.n = n, a.chunk = kNormChunk;
  a.out = workspace(zero_chunks_, chunks, "zero-count chunk totals");
  if (on_device_) OLMOREF_DEVICE(zero_count_chunks_device(a));
  else zero_count_chunks_host(a);
  std::vector<double> per(static_cast<size_t>(chunks));
  to_host(per.data(), a.out, per.size() * sizeof(double));
  int64_t total = 0;
  for (double z : per) total += static_cast<int64_t>(z);
  return total;
}
void KernelExecutor::adamw(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
                           int64_t n) {
  elements(AdamWOp{s, decay, grad, p, m, v}, n);
}
void KernelExecutor::moe_route(const float* logits, int64_t R, int64_t E, int64_t k, int normalize_p, float* scores,
                               float* lse, int32_t* top, float* weight) {
  MoERouteArgs a;
  a.R = R, a.E = E, a.k = k, a.normalize_p = normalize_p;
  a.logits = logits, a.scores = scores, a.lse = lse, a.top = top, a.weight = weight;
  if (on_device_) OLMOREF_DEVICE(moe_route_device(a));
  else moe_route_host(a);
}
void KernelExecutor::moe_combine_backward(const MoEDispatch& plan, const float* dout, const float* y,
                                          const float* weight, float* dy, float* dweight, int64_t d) {
  MoECombineBackwardArgs a;
  a.plan = plan, a.d = d, a.dout = dout, a.y = y, a.weight = weight, a.dy = dy, a.dweight = dweight;
  if (on_device_) OLMOREF_DEVICE(moe_combine_backward_device(a));
  else moe_combine_backward_host(a);
}
void KernelExecutor::moe_router_backward(const MoERouterBackward& in, float* dlogits) {
  const MoERouterBackwardArgs a{in, dlogits};
  if (on_device_) OLMOREF_DEVICE(moe_router_backward_device(a));
  else moe_router_backward_host(a);
}
void KernelExecutor::moe_dispatch(const MoEDispatch& plan, const float* x, float* xg, int64_t d) {
  elements(MoEDispatchOp{plan, x, xg, d}, plan.R * plan.k * d);
}
void KernelExecutor::moe_combine(const MoEDispatch& plan, const float* y, const float* weight, float* out, int64_t d) {
  elements(MoECombineOp{plan, y, weight, out, d}, plan.R * d);
}
void KernelExecutor::moe_scatter_add(const MoEDispatch& plan, const float* dxg, float* dx, int64_t d) {
  elements(MoEScatterAddOp{plan, dxg, dx, d}, plan.R * d);
}
void KernelExecutor::moe_shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n) {
  elements(MoESharedCombineOp{shared, routed, out, static_cast<float>(k + 1), moe_routed_share(k)}, n);
}
void KernelExecutor::moe_shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted,
                                                 int64_t n) {
  elements(MoESharedCombineBackwardOp{dout, dshared, drouted, static_cast<float>(k + 1), moe_routed_share(k)}, n);
}
void KernelExecutor::skip_step_adamw(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v,
                                     int64_t n) {
  elements(SkipStepAdamWOp{s, grad, p, m, v}, n);
}

// ---- attention ----
namespace {
AttentionArgs attention_args(const AttentionShape& s) {
  check_attention_parts(s);
  // The kernels hand tiles out by 32-bit ranks (attention_tile_by_rank), and a grid holds under 2^31 blocks.
  if (const int64_t tiles = s.B * s.H * ((s.T + kAttTile - 1) / kAttTile); tiles >= (int64_t{1} << 31))
    throw std::invalid_argument("attention: B·H·ceil(T/32) = " + std::to_string(tiles) +
                                " tiles, past the kernels' 2^31; use a smaller train.micro_batch_instances");
  AttentionArgs a;
  a.B = s.B, a.T = s.T, a.H = s.H, a.KV = s.KV, a.hd = s.hd, a.window = s.window, a.scale = s.scale;
  a.doc_start = s.doc_start, a.doc_end = s.doc_end;
  a.bf16 = s.precision == Precision::bf16;
  a.q_begin = s.q_begin, a.q_end = s.query_end(), a.k_begin = s.k_begin, a.k_end = s.key_end();
  return a;
}
}  // namespace

int64_t attention_workspace_bytes(int64_t B, int64_t H, int64_t T, int64_t hd) {
  AttentionArgs a;
  a.B = B, a.H = H, a.T = T;
  const int64_t rows = B * H * T;
  return static_cast<int64_t>(sizeof(float)) * (attention_scratch_rows(a) * T + rows + 2 * rows * hd);
}

void KernelExecutor::attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                       float* out, float* row_max, float* row_sum) {
  AttentionArgs a = attention_args(s);
  a.q = q, a.k = k, a.v = v, a.out = out, a.row_max = row_max, a.row_sum = row_sum;
  // No more blocks than the device holds at once: a second wave would leave the first's SMs idle at the end.
  if (on_device_) a.tile_blocks = std::min(a.tile_blocks, OLMOREF_DEVICE(attention_forward_resident_blocks()));
  a.scratch = workspace(att_rows_, attention_scratch_rows(a) * s.T, "attention score rows [32 per block in flight, T]");
  if (on_device_) OLMOREF_DEVICE(attention_forward_device(a));
  else attention_forward_host(a);
}
void KernelExecutor::attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                        const float* out, const float* row_max, const float* row_sum,
                                        const float* dout, float* dq, float* dk, float* dv) {
  AttentionArgs a = attention_args(s);
  // One argument struct serves forward and backward; backward only reads out and the row statistics.
  a.q = q, a.k = k, a.v = v, a.out = const_cast<float*>(out), a.row_max = const_cast<float*>(row_max);
  a.row_sum = const_cast<float*>(row_sum), a.dout = dout;
  a.dq = dq, a.dk = dk, a.dv = dv;
  const int64_t rows = s.B * s.H * s.T;
  a.row_d = workspace(att_row_d_, rows, "attention D = dO·o [B, H, T]");
  a.dk_head = workspace(att_dk_head_, rows * s.hd, "per-head key gradients [B, H, T, hd]");
  a.dv_head = workspace(att_dv_head_, rows * s.hd, "per-head value gradients [B, H, T, hd]");
  if (on_device_) OLMOREF_DEVICE(attention_backward_device(a));
  else attention_backward_host(a);
}

// ---- loss and the step's reductions ----
void KernelExecutor::cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T,
                                        int64_t V, float z_coef, int64_t global_n_targets, double* ce_terms,
                                        double* z_terms) {
  LossArgs a;
  a.R = rows, a.T = T, a.V = V, a.t0 = t0, a.logits = logits, a.tokens = tokens, a.z_coef = z_coef;
  a.global_n_targets = global_n_targets;
  a.ce_terms = workspace(ce_terms_, rows, "loss row terms (ce)");
  a.z_terms = workspace(z_terms_, rows, "loss row terms (z)");
  if (on_device_) OLMOREF_DEVICE(cross_entropy_device(a));
  else cross_entropy_host(a);
  to_host(ce_terms, a.ce_terms, static_cast<size_t>(rows) * sizeof(double));
  to_host(z_terms, a.z_terms, static_cast<size_t>(rows) * sizeof(double));
}
void KernelExecutor::grad_norm_chunks(const float* grad, int64_t n, double* out) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks == 0) return;
  NormChunkArgs a;
  a.grad = grad, a.n = n, a.chunk = kNormChunk;
  a.out = workspace(norm_chunks_, chunks, "gradient-norm chunk totals");
  if (on_device_) OLMOREF_DEVICE(grad_norm_chunks_device(a));
  else grad_norm_chunks_host(a);
  to_host(out, a.out, static_cast<size_t>(chunks) * sizeof(double));
}

}  // namespace olmoref::kernels
