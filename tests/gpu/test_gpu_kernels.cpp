// GPU kernels against the CPU reference, bit for bit: the exact GEMM (plain and with its SwiGLU epilogues), RMSNorm (plain and fused), the elementwise kernels (SkipStepAdamW and the MoE ops included) on the shapes of
// tests/kernels/*_cases.h (the same cases the host execution checks in CI) and the project's math
// functions over a dense sample of the fp32 range plus every special value; the real-step shapes of
// tests/kernels/real_shape_cases.h whole (CI checks a sample of them on the host). Without a device: SKIPPED, 77.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_exact.h"
#include "kernels/device_info.h"
#include "kernels/device_memory.h"
#include "kernels/elementwise.h"
#include "kernels/executor.h"
#include "kernels/gemm_exact.h"
#include "kernels/loss_exact.h"
#include "kernels/mathfn_device.h"
#include "kernels/rmsnorm_exact.h"
#include "ref/gemm.h"
#include "core/mathfn.h"
#include "ref/ops.h"
#include "core/optim.h"
#include "core/skip_step.h"
#include "model/gradient_tree.h"
#include "core/params.h"
#include "tests/common/attention_parts.h"
#include "tests/common/split_reductions.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/gemm_cases.h"
#include "tests/kernels/loss_cases.h"
#include "tests/kernels/norm_cases.h"
#include "tests/kernels/real_shape_cases.h"
#include "tests/kernels/swiglu_cases.h"
#include "tests/kernels/model_cases.h"
#include "tests/kernels/moe_cases.h"
#include "ref/cpu_executor.h"
#include "ref/moe.h"

using namespace olmoref;

namespace {

// Every CUDA call is checked: a fault must name where it surfaced, not show up later as a wrong bit.
void check_cuda(cudaError_t err, int line) {
  if (err != cudaSuccess)
    throw std::runtime_error("test_gpu_kernels.cpp:" + std::to_string(line) + ": " + cudaGetErrorString(err));
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  check_cuda(cudaMalloc(&d, v.size() * sizeof(T)), __LINE__);
  check_cuda(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), __LINE__);
  return d;
}

// --no-held (the sanitizer steps): no launch held to one block an SM. Those are the same kernels with dynamic shared
// memory they never touch, checked so that the benches' held columns mean something; under a sanitizer they would only
// repeat the launches as built.
bool g_no_held = false;

int check_gemm() {
  using kernels::GemmTiling;
  int failed = 0, n = 0, launches = 0;
  const int sms = kernels::current_device_sms();
  for (const testing::GemmCase& c : testing::gemm_cases()) {
    const testing::GemmOperands o = testing::gemm_operands(c, static_cast<uint32_t>(17 + n++));
    std::vector<float> want = o.c;
    const kernels::GemmArgs h = testing::gemm_args(c, o.a.data(), o.b.data(), want.data());
    gemm_reference(h.M, h.N, h.K, MatView{h.A, h.a_row, h.a_col}, MatView{h.B, h.b_row, h.b_col}, want.data(), h.ldc,
                   h.accumulate);
    // As the executor launches it (the tiling this device's SMs pick: kernels::gemm_pick_tiling), in the other tiling,
    // and each tiling held to one block an SM as bench/gemm_bench's columns are (their timings mean nothing unless
    // they compute the same).
    const GemmTiling picked = kernels::gemm_pick_tiling(c.M, c.N, sms);
    const GemmTiling other = picked == GemmTiling::tile64 ? GemmTiling::tile128 : GemmTiling::tile64;
    for (int how = 0; how < (g_no_held ? 2 : 4); ++how) {
      float *da = to_device(o.a), *db = to_device(o.b), *dc = to_device(o.c);
      const kernels::GemmArgs g = testing::gemm_args(c, da, db, dc);
      const GemmTiling tiling = how % 2 == 0 ? picked : other;
      if (how == 0) kernels::gemm_exact_device(g);
      else if (how == 1) kernels::gemm_exact_device(g, other);
      else kernels::gemm_exact_device_one_block_per_sm(g, tiling);
      const std::string name = std::string(kernels::gemm_tiling_name(tiling)) + (how == 0 ? ", as picked" : "") +
                               (how >= 2 ? ", one block an SM" : "");
      ++launches;
      std::vector<float> got(o.c.size());
      const cudaError_t err = cudaDeviceSynchronize();
      check_cuda(cudaMemcpy(got.data(), dc, got.size() * sizeof(float), cudaMemcpyDeviceToHost), __LINE__);
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
      if (err != cudaSuccess || std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
        std::printf("FAILED gemm (%s) M=%lld N=%lld K=%lld layout %d accumulate %d (%s)\n", name.c_str(), (long long)c.M,
                    (long long)c.N, (long long)c.K, c.layout, c.accumulate, cudaGetErrorString(err));
        ++failed;
      }
    }
  }
  std::printf("gemm exact: %d of %d launches bitwise equal (each case as picked at %d SMs and in the other tiling%s)\n",
              launches - failed, launches, sms, g_no_held ? "" : ", each also held to one block an SM");
  // Both tiles' kernels are written for two blocks an SM (kernels/gemm_exact.cu: __launch_bounds__(256, 2), 125 and 108
  // registers); a device or toolkit that gives one fewer has lost half its resident warps without a wrong bit to show it.
  for (const GemmTiling tiling : {GemmTiling::tile128, GemmTiling::tile64}) {
    const kernels::GemmDeviceFit fit = kernels::gemm_exact_device_fit(tiling);
    std::printf("gemm exact %s: %d registers, %d blocks an SM\n", kernels::gemm_tiling_name(tiling), fit.registers,
                fit.blocks_per_sm);
    if (fit.blocks_per_sm < 2) {
      std::printf("FAILED gemm %s: %d block(s) an SM where the kernel is bounded to 2\n",
                  kernels::gemm_tiling_name(tiling), fit.blocks_per_sm);
      ++failed;
    }
  }
  return failed;
}

template <typename T>
std::vector<T> from_device(const T* d, size_t n) {
  std::vector<T> v(n);
  check_cuda(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), __LINE__);
  return v;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int check_rmsnorm() {
  int failed = 0, n_cases = 0;
  for (const testing::NormCase& c : testing::norm_cases()) {
    ++n_cases;
    const testing::NormOperands o = testing::norm_operands(c, static_cast<uint32_t>(c.R * 1000 + c.n));
    const size_t rn = static_cast<size_t>(c.R * c.n), R = static_cast<size_t>(c.R), n = static_cast<size_t>(c.n);
    std::vector<float> y_ref(rn), ir_ref(R), dx_ref(rn), dw_ref(n);
    rmsnorm_forward(o.x.data(), o.w.data(), y_ref.data(), ir_ref.data(), c.R, c.n, 1e-6f, nullptr);
    rmsnorm_backward(o.x.data(), o.w.data(), ir_ref.data(), o.dy.data(), dx_ref.data(), dw_ref.data(), c.R, c.n, nullptr);
    float *dx_in = to_device(o.x), *dw_in = to_device(o.w), *ddy = to_device(o.dy);
    float *dy_out = to_device(std::vector<float>(rn)), *dir = to_device(std::vector<float>(R));
    float *ddx = to_device(std::vector<float>(rn)), *ddw = to_device(std::vector<float>(n));
    const kernels::RmsNormArgs a = testing::norm_args(c, dx_in, dw_in, dy_out, dir, ddy, ddx, ddw);
    kernels::rmsnorm_forward_device(a);
    kernels::rmsnorm_backward_device(a);
    const cudaError_t err = cudaDeviceSynchronize();
    const bool same = err == cudaSuccess && bits_equal(from_device(dy_out, rn), y_ref) &&
                      bits_equal(from_device(dir, R), ir_ref) && bits_equal(from_device(ddx, rn), dx_ref) &&
                      bits_equal(from_device(ddw, n), dw_ref);
    for (float* p : {dx_in, dw_in, ddy, dy_out, dir, ddx, ddw}) cudaFree(p);
    if (!same) {
      std::printf("FAILED rmsnorm R=%lld n=%lld (%s)\n", (long long)c.R, (long long)c.n, cudaGetErrorString(err));
      ++failed;
    }
  }
  std::printf("rmsnorm exact: %d of %d cases bitwise equal (forward, inverse RMS, dx, dw)\n", n_cases - failed, n_cases);
  return failed;
}

// The fused forms (residual; QK-norm + RoPE, forward and backward) on the device against the CPU's unfused
// sequences, fp32 and bf16: the cases tests/kernels/test_decomposition.cpp runs through the host execution in CI.
// Reductions over an instance's rows split in runs, each continuing the chain (accumulate), on the device: one
// call's bits (tests/common/split_reductions.h).
int check_split_reductions() {
  kernels::KernelExecutor gpu(true);
  const std::vector<std::string> bad = testing::split_reduction_mismatches(gpu);
  for (const std::string& what : bad) std::printf("FAILED %s over rows split in runs\n", what.c_str());
  std::printf("reductions over rows split in runs: %s\n", bad.empty() ? "bitwise equal to one call" : "DIFFERENT");
  return static_cast<int>(bad.size());
}

int check_fused_norm() {
  int failed = 0, n_cases = 0;
  CpuExecutor cpu;
  kernels::KernelExecutor gpu(true);
  for (bool bf16 : {false, true}) {
    for (const testing::NormCase& c : testing::norm_cases()) {
      ++n_cases;
      const testing::NormOperands o = testing::fused_operands(c.R, c.n, static_cast<uint32_t>(c.R * 100 + c.n), bf16);
      if (!testing::same_bits(testing::run_residual_norm(gpu, true, bf16, c.R, c.n, o),
                              testing::run_residual_norm(cpu, false, bf16, c.R, c.n, o))) {
        std::printf("FAILED rmsnorm_residual_forward R=%lld n=%lld bf16 %d\n", (long long)c.R, (long long)c.n, bf16);
        ++failed;
      }
    }
    for (const testing::RopeNormCase& c : testing::rope_norm_cases()) {
      ++n_cases;
      const testing::NormOperands o = testing::fused_operands(c.R, c.n(), static_cast<uint32_t>(c.R + 7 * c.hd), bf16);
      if (!testing::same_bits(testing::run_rope_norm(gpu, true, bf16, c, o),
                              testing::run_rope_norm(cpu, false, bf16, c, o)) ||
          !testing::same_bits(testing::run_rope_norm_backward(gpu, true, bf16, c, o),
                              testing::run_rope_norm_backward(cpu, false, bf16, c, o))) {
        std::printf("FAILED rmsnorm_rope_forward / rope_rmsnorm_backward R=%lld heads=%lld hd=%lld bf16 %d\n",
                    (long long)c.R, (long long)c.n_heads, (long long)c.hd, bf16);
        ++failed;
      }
    }
  }
  std::printf("rmsnorm exact, fused forms: %d of %d cases bitwise equal\n", n_cases - failed, n_cases);
  return failed;
}

// SwiGLU fused into its products (the GEMM store epilogues) against the CPU's unfused sequence.
int check_gemm_swiglu() {
  int failed = 0, n_cases = 0;
  CpuExecutor cpu;
  kernels::KernelExecutor gpu(true);
  for (bool bf16 : {false, true})
    for (const testing::SwigluShape& s : testing::kSwigluShapes) {
      ++n_cases;
      const std::string diff =
          testing::runs_differ(testing::run_swiglu(cpu, s, bf16, false), testing::run_swiglu(gpu, s, bf16, true));
      if (!diff.empty()) {
        std::printf("FAILED matmul_*_swiglu M=%lld N=%lld K=%lld bf16 %d: %s\n", (long long)s.M, (long long)s.N,
                    (long long)s.K, bf16, diff.c_str());
        ++failed;
      }
    }
  std::printf("gemm exact, SwiGLU epilogues: %d of %d cases bitwise equal\n", n_cases - failed, n_cases);
  return failed;
}

// SwiGLU (fp32 and bf16), AdamW over a real parameter layout, SkipStepAdamW, bf16 rounding, the tree add and clipping scale,
// against the CPU loops that call the same element functions.
int check_elementwise() {
  const int64_t n = 100003;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  std::vector<float> g(n), up(n), da(n);
  for (int64_t i = 0; i < n; ++i) g[i] = u(rng), up[i] = u(rng), da[i] = 1e-3f * u(rng);
  int failed = 0;
  auto report = [&](const char* what, bool ok) {
    std::printf("%s: %s\n", what, ok ? "bitwise equal" : "DIFFERENT");
    failed += !ok;
  };
  for (const bool bf16 : {false, true}) {
    std::vector<float> gq = g, uq = up, daq = da;
    if (bf16)
      for (int64_t i = 0; i < n; ++i) gq[i] = round_bf16(g[i]), uq[i] = round_bf16(up[i]), daq[i] = round_bf16(da[i]);
    std::vector<float> a(n), dg(n), du(n);
    if (bf16) {
      swiglu_forward_bf16(gq.data(), uq.data(), a.data(), n, nullptr);
      swiglu_backward_bf16(gq.data(), uq.data(), daq.data(), dg.data(), du.data(), n, nullptr);
    } else {
      swiglu_forward(gq.data(), uq.data(), a.data(), n, nullptr);
      swiglu_backward(gq.data(), uq.data(), daq.data(), dg.data(), du.data(), n, nullptr);
    }
    float *dG = to_device(gq), *dU = to_device(uq), *dDA = to_device(daq);
    float *dA = to_device(std::vector<float>(n)), *dDG = to_device(std::vector<float>(n)), *dDU = to_device(std::vector<float>(n));
    kernels::run_device(kernels::SwigluForwardOp{dG, dU, dA, bf16}, n);
    kernels::run_device(kernels::SwigluBackwardOp{dG, dU, dDA, dDG, dDU, bf16}, n);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    report(bf16 ? "swiglu bf16" : "swiglu fp32",
           bits_equal(from_device(dA, n), a) && bits_equal(from_device(dDG, n), dg) && bits_equal(from_device(dDU, n), du));
    for (float* p : {dG, dU, dDA, dA, dDG, dDU}) cudaFree(p);
  }
  {  // AdamW over the tiny model's layout: decay per tensor as core/optim.cpp applies it
    ModelConfig mc;
    mc.vocab_size = 97, mc.d_model = 32, mc.n_layers = 2, mc.n_heads = 4, mc.n_kv_heads = 2, mc.head_dim = 8;
    mc.ffn_hidden = 64, mc.swa_pattern = {4, -1};
    const ParamLayout L(mc);
    AdamWConfig oc;
    oc.lr = 3e-3, oc.weight_decay = 0.1;
    std::vector<float> p(L.total), m(L.total), v(L.total), gr(L.total);
    for (int64_t i = 0; i < L.total; ++i) p[i] = u(rng), m[i] = 1e-3f * u(rng), v[i] = 1e-6f * std::fabs(u(rng)), gr[i] = 1e-2f * u(rng);
    float *dP = to_device(p), *dM = to_device(m), *dV = to_device(v), *dGR = to_device(gr);
    const int64_t step = 7;
    const double lr = 2.5e-3;
    adamw_step_range(oc, L, step, lr, 0, L.total, p.data(), gr.data(), m.data(), v.data(), nullptr);
    const elem::AdamWScalars sc = adamw_scalars(oc, step, lr);
    for (const ParamInfo& info : L.params) {
      kernels::run_device(kernels::AdamWOp{sc, adamw_decay(oc, info, lr), dGR + info.offset, dP + info.offset, dM + info.offset, dV + info.offset}, info.numel);
    }
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    report("adamw", bits_equal(from_device(dP, L.total), p) && bits_equal(from_device(dM, L.total), m) &&
                        bits_equal(from_device(dV, L.total), v));
    for (float* q : {dP, dM, dV, dGR}) cudaFree(q);
  }
  for (const float sf : {1.0f, 0.0f}) {  // SkipStepAdamW, a stepping and a skipped step, specials in the gradient
    AdamWConfig oc;
    oc.lr = 3e-3, oc.weight_decay = 0.1;
    std::vector<float> p(n), m(n), v(n), gr(n);
    for (int64_t i = 0; i < n; ++i) p[i] = u(rng), m[i] = 1e-3f * u(rng), v[i] = 1e-6f * std::fabs(u(rng)), gr[i] = 1e-2f * u(rng);
    gr[0] = -0.0f, gr[1] = std::numeric_limits<float>::quiet_NaN(), gr[2] = std::numeric_limits<float>::infinity();
    float *dP = to_device(p), *dM = to_device(m), *dV = to_device(v), *dGR = to_device(gr);
    const elem::SkipStepScalars sc = skip_step_scalars(oc, 2.5e-3, oc.weight_decay, 6.0f, sf);
    skip_step_elements(sc, gr.data(), p.data(), m.data(), v.data(), n, nullptr);
    kernels::run_device(kernels::SkipStepAdamWOp{sc, dGR, dP, dM, dV}, n);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    report(sf == 1.0f ? "skip_step_adamw (step)" : "skip_step_adamw (skipped)",
           bits_equal(from_device(dP, n), p) && bits_equal(from_device(dM, n), m) && bits_equal(from_device(dV, n), v));
    for (float* q : {dP, dM, dV, dGR}) cudaFree(q);
  }
  {  // bf16 rounding (with specials), the tree add, the clipping scale
    std::vector<float> x = g;
    for (uint32_t b : {0x7f7fffffu, 0x7fc00001u, 0xff800000u, 0x00000001u, 0x80000000u}) x.push_back(det::from_bits(b));
    std::vector<float> r = x, t = g, sc = g;
    round_bf16_inplace(r.data(), static_cast<int64_t>(r.size()), nullptr);
    tree_add(t.data(), up.data(), n, nullptr);
    scale_inplace(sc.data(), n, 0.37f, nullptr);
    float *dX = to_device(x), *dT = to_device(g), *dS = to_device(up), *dC = to_device(g);
    kernels::run_device(kernels::RoundBf16Op{dX, dX}, static_cast<int64_t>(x.size()));
    kernels::run_device(kernels::AddOp{dT, dS, dT}, n);
    kernels::run_device(kernels::ScaleOp{dC, 0.37f}, n);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    report("round_bf16", bits_equal(from_device(dX, x.size()), r));
    report("tree_add", bits_equal(from_device(dT, n), t));
    report("scale", bits_equal(from_device(dC, n), sc));
    for (float* q : {dX, dT, dS, dC}) cudaFree(q);
  }
  return failed;
}

// Cross-entropy rows and per-instance totals, and gradient-norm chunks, on the cases of tests/kernels.
int check_loss() {
  int failed = 0, n_cases = 0;
  for (const testing::LossCase& c : testing::loss_cases()) {
    ++n_cases;
    const testing::LossOperands o = testing::loss_operands(c, static_cast<uint32_t>(c.T * 100 + c.V));
    const int64_t N = 3 * c.B * (c.T - 1);
    std::vector<float> ref = o.logits;
    std::vector<double> ce_ref, z_ref;
    for (int64_t b = 0; b < c.B; ++b) {
      const LossSums s = cross_entropy_forward_backward(ref.data() + b * c.T * c.V, o.tokens.data() + b * c.T, 1, c.T,
                                                        c.V, 1e-5f, N, nullptr);
      ce_ref.push_back(s.ce);
      z_ref.push_back(s.z);
    }
    const size_t R = static_cast<size_t>(c.B * c.T), B = static_cast<size_t>(c.B);
    float* dl = to_device(o.logits);
    uint32_t* dt = to_device(o.tokens);
    double *dce = to_device(std::vector<double>(R)), *dz = to_device(std::vector<double>(R));
    double *dcet = to_device(std::vector<double>(B)), *dzt = to_device(std::vector<double>(B));
    kernels::LossArgs a;
    a.R = c.B * c.T, a.T = c.T, a.V = c.V, a.logits = dl, a.tokens = dt, a.z_coef = 1e-5f, a.global_n_targets = N;
    a.ce_terms = dce, a.z_terms = dz, a.ce_total = dcet, a.z_total = dzt;
    kernels::cross_entropy_device(a);
    const cudaError_t err = cudaDeviceSynchronize();
    const std::vector<double> ce = from_device(dcet, B), z = from_device(dzt, B);
    const bool same = err == cudaSuccess && bits_equal(from_device(dl, ref.size()), ref) &&
                      std::memcmp(ce.data(), ce_ref.data(), B * 8) == 0 && std::memcmp(z.data(), z_ref.data(), B * 8) == 0;
    cudaFree(dl);
    cudaFree(dt);
    for (double* p : {dce, dz, dcet, dzt}) cudaFree(p);
    if (!same) {
      std::printf("FAILED cross-entropy B=%lld T=%lld V=%lld\n", (long long)c.B, (long long)c.T, (long long)c.V);
      ++failed;
    }
  }
  std::printf("cross-entropy exact: %d of %d cases bitwise equal\n", n_cases - failed, n_cases);
  for (const int64_t n : {int64_t{31}, int64_t{65537}, int64_t{3 * 65536 + 1000}}) {
    const std::vector<float> g = testing::norm_vector(n, static_cast<uint32_t>(n));
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    std::vector<double> want(static_cast<size_t>(chunks));
    grad_norm_chunks(g.data(), n, 0, chunks, want.data(), nullptr);
    float* dg = to_device(g);
    double* dout = to_device(std::vector<double>(want.size()));
    kernels::NormChunkArgs a;
    a.grad = dg, a.n = n, a.chunk = kNormChunk, a.out = dout;
    kernels::grad_norm_chunks_device(a);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    const std::vector<double> got = from_device(dout, want.size());
    const bool same = std::memcmp(got.data(), want.data(), want.size() * 8) == 0;
    std::printf("grad-norm chunks n=%lld: %s\n", (long long)n, same ? "bitwise equal" : "DIFFERENT");
    failed += !same;
    cudaFree(dout);
    // The zero count (Megatron's num-zeros) of the same vector with zeros, -0 and a NaN planted.
    std::vector<float> z = g;
    for (int64_t i = 0; i < n; i += 5) z[static_cast<size_t>(i)] = (i % 2) ? -0.0f : 0.0f;
    z[1] = std::numeric_limits<float>::quiet_NaN();
    const int64_t want_zeros = count_zeros(z.data(), n, nullptr);
    float* dz = to_device(z);
    double* dcount = to_device(std::vector<double>(static_cast<size_t>(chunks)));
    kernels::ZeroCountArgs za;
    za.x = dz, za.n = n, za.chunk = kNormChunk, za.out = dcount;
    kernels::zero_count_chunks_device(za);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    int64_t got_zeros = 0;
    for (double c : from_device(dcount, static_cast<size_t>(chunks))) got_zeros += static_cast<int64_t>(c);
    std::printf("zero count n=%lld: %lld (host %lld)\n", (long long)n, (long long)got_zeros, (long long)want_zeros);
    failed += got_zeros != want_zeros;
    cudaFree(dg);
    cudaFree(dz);
    cudaFree(dcount);
  }
  return failed;
}

// Embedding forward/backward (repeated and absent tokens) and RoPE forward/backward (GQA head counts).
int check_embed_rope() {
  int failed = 0;
  const int64_t V = 53, d = 24, R = 300, T = 50, hd = 8;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> table(V * d), dx(R * d);
  std::vector<uint32_t> tokens(R);
  for (auto& x : table) x = u(rng);
  for (auto& x : dx) x = std::ldexp(u(rng), static_cast<int>(rng() % 20) - 10);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % (V - 3));  // the last 3 tokens never occur
  std::vector<float> x_ref(R * d), dt_ref(V * d);
  embedding_forward(table.data(), tokens.data(), x_ref.data(), R, d, nullptr);
  embedding_backward(tokens.data(), dx.data(), dt_ref.data(), R, V, d, nullptr);
  std::vector<int64_t> start, order;
  embedding_position_order(tokens.data(), R, V, start, order);
  float *dtab = to_device(table), *ddx = to_device(dx), *dx_out = to_device(std::vector<float>(R * d));
  float* ddt = to_device(std::vector<float>(V * d));
  uint32_t* dtok = to_device(tokens);
  int64_t *dstart = to_device(start), *dorder = to_device(order);
  kernels::run_device(kernels::EmbeddingForwardOp{dtab, dtok, dx_out, d}, R * d);
  kernels::run_device(kernels::EmbeddingBackwardOp{dstart, dorder, ddx, ddt, d, false}, V * d);
  check_cuda(cudaDeviceSynchronize(), __LINE__);
  const bool emb = bits_equal(from_device(dx_out, R * d), x_ref) && bits_equal(from_device(ddt, V * d), dt_ref);
  std::printf("embedding forward/backward: %s\n", emb ? "bitwise equal" : "DIFFERENT");
  failed += !emb;
  cudaFree(dtab), cudaFree(ddx), cudaFree(dx_out), cudaFree(ddt), cudaFree(dtok), cudaFree(dstart), cudaFree(dorder);
  const RopeTable rt = make_rope_table(T, hd, 500000.0);
  for (const int64_t heads : {int64_t{4}, int64_t{2}}) {
    std::vector<float> q(R * heads * hd);
    for (auto& x : q) x = u(rng);
    std::vector<float> fwd = q, bwd = q;
    rope_forward(fwd.data(), R, heads, rt, nullptr);
    rope_backward(bwd.data(), R, heads, rt, nullptr);
    float *dq = to_device(q), *dq2 = to_device(q), *dc = to_device(rt.cos), *ds = to_device(rt.sin);
    kernels::run_device(kernels::RopeOp{dq, heads, hd, T, dc, ds, false}, kernels::rope_elements(R, heads, hd));
    kernels::run_device(kernels::RopeOp{dq2, heads, hd, T, dc, ds, true}, kernels::rope_elements(R, heads, hd));
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    const bool ok = bits_equal(from_device(dq, q.size()), fwd) && bits_equal(from_device(dq2, q.size()), bwd);
    std::printf("rope %lld heads forward/backward: %s\n", (long long)heads, ok ? "bitwise equal" : "DIFFERENT");
    failed += !ok;
    cudaFree(dq), cudaFree(dq2), cudaFree(dc), cudaFree(ds);
  }
  return failed;
}

// Every case with the default forward blocks in flight and with 3 (each block takes many tiles through its scratch
// rows), and the long cases at the default, at 64 (the forward's snake dealing turns twice) and at what this device
// holds at once (the executor's count); the scratch is exactly [attention_scratch_rows, T], so memcheck sees a block
// that strays from its rows.
std::vector<std::pair<testing::AttentionCase, int64_t>> attention_runs() {
  std::vector<std::pair<testing::AttentionCase, int64_t>> runs;
  for (const int64_t tile_blocks : {kernels::kAttentionTileBlocks, int64_t{3}})
    for (const testing::AttentionCase& c : testing::attention_cases()) runs.emplace_back(c, tile_blocks);
  const int64_t resident = kernels::attention_forward_resident_blocks();
  for (const int64_t tile_blocks : {kernels::kAttentionTileBlocks, int64_t{64}, resident})
    for (const testing::AttentionCase& c : testing::long_attention_cases()) runs.emplace_back(c, tile_blocks);
  return runs;
}
float* attention_scratch(kernels::AttentionArgs& a, int64_t tile_blocks) {
  a.tile_blocks = tile_blocks;
  return to_device(std::vector<float>(static_cast<size_t>(kernels::attention_scratch_rows(a) * a.T)));
}

// Context parallelism: the kernels over a part of an instance (tests/common/attention_parts.h) write exactly the
// part's rows with ref/'s whole-instance bits, as tests/kernels/test_decomposition.cpp checks on the host.
int check_attention_parts() {
  int failed = 0, runs = 0;
  for (const testing::AttentionCase& c : testing::part_attention_cases()) {
    const testing::AttentionOperands o = testing::attention_operands(c, static_cast<uint32_t>(c.T * 7 + c.hd));
    const testing::AttentionOperands g = testing::attention_operands(c, static_cast<uint32_t>(c.T * 11 + 3));
    const size_t qn = static_cast<size_t>(c.B * c.T * c.H * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
    const size_t stats = static_cast<size_t>(c.B * c.H * c.T);
    const int64_t qw = c.H * c.hd, kw = c.KV * c.hd;
    const testing::AttentionOutputs whole = testing::whole_instance_outputs(c, o, g.q);
    int32_t* docs[2] = {o.doc_start.empty() ? nullptr : to_device(o.doc_start), o.doc_end.empty() ? nullptr : to_device(o.doc_end)};
    float *d_q = to_device(o.q), *d_k = to_device(o.k), *d_v = to_device(o.v), *d_out = to_device(whole.out);
    float *d_m = to_device(whole.row_max), *d_l = to_device(whole.row_sum), *d_go = to_device(g.q);
    float* row_d = to_device(std::vector<float>(stats));
    float *dkh = to_device(std::vector<float>(stats * static_cast<size_t>(c.hd))), *dvh = to_device(std::vector<float>(stats * static_cast<size_t>(c.hd)));
    for (const testing::AttentionPart& part : testing::attention_parts(c.T)) {
      ++runs;
      kernels::AttentionArgs a = testing::attention_args(c);
      a.doc_start = docs[0], a.doc_end = docs[1];
      a.q_begin = part.q_begin, a.q_end = part.q_end, a.k_begin = part.k_begin, a.k_end = part.k_end;
      const testing::AttentionOutputs unwritten = testing::unwritten_outputs(qn, stats, kn);
      float *p_out = to_device(unwritten.out), *p_m = to_device(unwritten.row_max), *p_l = to_device(unwritten.row_sum);
      float* scratch = attention_scratch(a, kernels::kAttentionTileBlocks);
      a.q = d_q, a.k = d_k, a.v = d_v, a.out = p_out, a.row_max = p_m, a.row_sum = p_l, a.scratch = scratch;
      kernels::attention_forward_device(a);
      float *p_dq = to_device(unwritten.dq), *p_dk = to_device(unwritten.dk), *p_dv = to_device(unwritten.dv);
      a.out = d_out, a.row_max = d_m, a.row_sum = d_l, a.dout = d_go, a.dq = p_dq, a.dk = p_dk, a.dv = p_dv;
      a.row_d = row_d, a.dk_head = dkh, a.dv_head = dvh;
      kernels::attention_backward_device(a);
      const cudaError_t err = cudaDeviceSynchronize();
      const testing::AttentionOutputs got{from_device(p_out, qn), from_device(p_m, stats), from_device(p_l, stats),
                                          from_device(p_dq, qn),  from_device(p_dk, kn),   from_device(p_dv, kn)};
      const bool same = err == cudaSuccess && testing::wrong_part_output(got, whole, c.T, qw, kw, part).empty();
      for (float* p : {p_out, p_m, p_l, scratch, p_dq, p_dk, p_dv}) cudaFree(p);
      if (!same) {
        std::printf("FAILED attention part T=%lld hd=%lld window=%lld bf16=%d docs=%u queries [%lld, %lld) keys [%lld, %lld)\n",
                    (long long)c.T, (long long)c.hd, (long long)c.window, c.bf16, c.docs, (long long)part.q_begin,
                    (long long)part.q_end, (long long)part.k_begin, (long long)part.k_end);
        ++failed;
      }
    }
    for (float* p : {d_q, d_k, d_v, d_out, d_m, d_l, d_go, row_d, dkh, dvh}) cudaFree(p);
    for (int32_t* p : docs) cudaFree(p);
  }
  std::printf("attention over parts of an instance: %d of %d parts bitwise equal, nothing else written\n", runs - failed, runs);
  return failed;
}

int check_attention() {
  int failed = 0, n_cases = 0;
  for (const auto& [c, tile_blocks] : attention_runs()) {
    ++n_cases;
    const testing::AttentionOperands o = testing::attention_operands(c, static_cast<uint32_t>(c.T * 7 + c.hd));
    const size_t out_n = static_cast<size_t>(c.B * c.T * c.H * c.hd), stats = static_cast<size_t>(c.B * c.H * c.T);
    std::vector<float> out_ref(out_n), m_ref(stats), l_ref(stats);
    attention_forward(testing::attention_shape(c, o), o.q.data(), o.k.data(), o.v.data(), out_ref.data(), m_ref.data(),
                      l_ref.data(), nullptr);
    kernels::AttentionArgs a = testing::attention_args(c);
    int32_t* docs[2] = {o.doc_start.empty() ? nullptr : to_device(o.doc_start), o.doc_end.empty() ? nullptr : to_device(o.doc_end)};
    a.doc_start = docs[0], a.doc_end = docs[1];
    float *dq = to_device(o.q), *dk = to_device(o.k), *dv = to_device(o.v), *dout = to_device(std::vector<float>(out_n));
    float *dm = to_device(std::vector<float>(stats)), *dl = to_device(std::vector<float>(stats));
    float* ds = attention_scratch(a, tile_blocks);
    a.q = dq, a.k = dk, a.v = dv, a.out = dout, a.row_max = dm, a.row_sum = dl, a.scratch = ds;
    // As the executor launches it, and held to one block an SM as bench/attention_bench times it (its timing means
    // nothing unless it computes the same): the short cases at the executor's grid, none under --no-held (the
    // sanitizer steps, which run this family too).
    bool same = true;
    for (const bool held : {false, true}) {
      if (held && (g_no_held || tile_blocks != kernels::kAttentionTileBlocks || c.T > 100)) continue;
      for (const auto& [p, n] : {std::pair{dout, out_n}, std::pair{dm, stats}, std::pair{dl, stats}})
        check_cuda(cudaMemset(p, 0, n * sizeof(float)), __LINE__);
      held ? kernels::attention_forward_device_one_block_per_sm(a) : kernels::attention_forward_device(a);
      const cudaError_t err = cudaDeviceSynchronize();
      same = same && err == cudaSuccess && bits_equal(from_device(dout, out_n), out_ref) &&
             bits_equal(from_device(dm, stats), m_ref) && bits_equal(from_device(dl, stats), l_ref);
    }
    for (float* p : {dq, dk, dv, dout, dm, dl, ds}) cudaFree(p);
    for (int32_t* p : docs) cudaFree(p);
    if (!same) {
      std::printf("FAILED attention T=%lld H=%lld KV=%lld hd=%lld window=%lld bf16=%d docs=%u blocks=%lld\n",
                  (long long)c.T, (long long)c.H, (long long)c.KV, (long long)c.hd, (long long)c.window, c.bf16, c.docs,
                  (long long)tile_blocks);
      ++failed;
    }
  }
  std::printf("attention forward exact: %d of %d cases bitwise equal (the short ones also held to one block an SM)\n",
              n_cases - failed, n_cases);
  int bwd_failed = 0;
  for (const auto& [c, tile_blocks] : attention_runs()) {
    // The backward has no scratch (one block per tile): tile_blocks only picks the cases held to one block an SM.
    const testing::AttentionOperands o = testing::attention_operands(c, static_cast<uint32_t>(c.T * 7 + c.hd));
    const testing::AttentionOperands g = testing::attention_operands(c, static_cast<uint32_t>(c.T * 11 + 3));
    const size_t qn = static_cast<size_t>(c.B * c.T * c.H * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
    const size_t stats = static_cast<size_t>(c.B * c.H * c.T);
    const AttentionShape shape = testing::attention_shape(c, o);
    std::vector<float> out(qn), m(stats), l(stats), dq_ref(qn), dk_ref(kn), dv_ref(kn);
    attention_forward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data(), nullptr);
    attention_backward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data(), g.q.data(),
                       dq_ref.data(), dk_ref.data(), dv_ref.data(), nullptr);
    kernels::AttentionArgs a = testing::attention_args(c);
    int32_t* docs[2] = {o.doc_start.empty() ? nullptr : to_device(o.doc_start), o.doc_end.empty() ? nullptr : to_device(o.doc_end)};
    a.doc_start = docs[0], a.doc_end = docs[1];
    float *dq_in = to_device(o.q), *dk_in = to_device(o.k), *dv_in = to_device(o.v), *dout_in = to_device(out);
    float *dm = to_device(m), *dl = to_device(l), *dgo = to_device(g.q);
    float *ddq = to_device(std::vector<float>(qn)), *ddk = to_device(std::vector<float>(kn)), *ddv = to_device(std::vector<float>(kn));
    float* row_d = to_device(std::vector<float>(stats));
    float *dkh = to_device(std::vector<float>(stats * static_cast<size_t>(c.hd))), *dvh = to_device(std::vector<float>(stats * static_cast<size_t>(c.hd)));
    a.q = dq_in, a.k = dk_in, a.v = dv_in, a.out = dout_in, a.row_max = dm, a.row_sum = dl, a.dout = dgo;
    a.dq = ddq, a.dk = ddk, a.dv = ddv, a.row_d = row_d, a.dk_head = dkh, a.dv_head = dvh;
    bool same = true;
    for (const bool held : {false, true}) {
      if (held && (g_no_held || tile_blocks != kernels::kAttentionTileBlocks || c.T > 100)) continue;  // as in the forward
      for (float* p : {ddq, ddk, ddv}) check_cuda(cudaMemset(p, 0, (p == ddq ? qn : kn) * sizeof(float)), __LINE__);
      held ? kernels::attention_backward_device_one_block_per_sm(a) : kernels::attention_backward_device(a);
      const cudaError_t err = cudaDeviceSynchronize();
      same = same && err == cudaSuccess && bits_equal(from_device(ddq, qn), dq_ref) &&
             bits_equal(from_device(ddk, kn), dk_ref) && bits_equal(from_device(ddv, kn), dv_ref);
    }
    for (float* p : {dq_in, dk_in, dv_in, dout_in, dm, dl, dgo, ddq, ddk, ddv, row_d, dkh, dvh}) cudaFree(p);
    for (int32_t* p : docs) cudaFree(p);
    bwd_failed += !same;
  }
  std::printf("attention backward exact: %d of %d cases bitwise equal (the short ones also held to one block an SM)\n",
              n_cases - bwd_failed, n_cases);
  // The three tile kernels are written for two blocks an SM (__launch_bounds__(256, 2), kernels-ptxas-budget); a
  // device or toolkit that gives one fewer has lost half its resident warps without a wrong bit to show it.
  const kernels::AttentionDeviceFit fit = kernels::attention_device_fit();
  std::printf("attention: forward %d registers, %d blocks an SM; backward query %d, %d; key %d, %d\n",
              fit.forward_registers, fit.forward_blocks_per_sm, fit.query_registers, fit.query_blocks_per_sm,
              fit.key_registers, fit.key_blocks_per_sm);
  const int fewer = (fit.forward_blocks_per_sm < 2) + (fit.query_blocks_per_sm < 2) + (fit.key_blocks_per_sm < 2);
  if (fewer > 0) std::printf("FAILED attention: %d kernel(s) under the 2 blocks an SM they are bounded to\n", fewer);
  return failed + bwd_failed + fewer + check_attention_parts();
}

int check_math() {
  // Every 97th fp32 bit pattern (44 million inputs) plus the special values.
  std::vector<float> in;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) in.push_back(det::from_bits(static_cast<uint32_t>(u)));
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0x007fffffu,
                     0x3f800000u, 0xbf800000u})
    in.push_back(det::from_bits(u));
  std::vector<float> out(in.size());
  int failed = 0;
  const struct { kernels::MathFn fn; const char* name; float (*host)(float); } fns[] = {
      {kernels::MathFn::expf, "expf", det::expf},
      {kernels::MathFn::logf, "logf", det::logf},
      {kernels::MathFn::sigmoidf, "sigmoidf", det::sigmoidf},
      {kernels::MathFn::siluf, "siluf", det::siluf}};
  for (const auto& f : fns) {
    kernels::mathfn_on_device(f.fn, in.data(), out.data(), static_cast<int64_t>(in.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const float h = f.host(in[i]);
      const bool both_nan = h != h && out[i] != out[i];
      if (!both_nan && det::bits(h) != det::bits(out[i])) {
        if (bad < 3) std::printf("  %s(%08x): cpu %08x gpu %08x\n", f.name, det::bits(in[i]), det::bits(h), det::bits(out[i]));
        ++bad;
      }
    }
    std::printf("%s: %lld of %zu inputs differ\n", f.name, (long long)bad, in.size());
    failed += bad != 0;
  }
  return failed;
}

// Device buffers of one real-shape run, freed together (also when a check throws).
struct DeviceBuffers {
  std::vector<void*> held;
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : held) cudaFree(p);
  }
  template <typename T>
  T* copy(const T* host, int64_t n) {
    T* d = nullptr;
    check_cuda(cudaMalloc(&d, static_cast<size_t>(n) * sizeof(T)), __LINE__);
    held.push_back(d);
    if (host) check_cuda(cudaMemcpy(d, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice), __LINE__);
    return d;
  }
  template <typename T>
  T* empty(int64_t n) { return copy(static_cast<const T*>(nullptr), n); }
};
template <typename T>
void copy_back(T* host, const T* device, int64_t n) {
  check_cuda(cudaDeviceSynchronize(), __LINE__);  // a fault in the kernel surfaces here, before the copy
  check_cuda(cudaMemcpy(host, device, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost), __LINE__);
}

// The real-shape cases (tests/kernels/real_shape_cases.h) whole on the device, every output against ref/ on every
// host core: the host execution in CI checks only a sample of each.
int check_real_shapes() {
  testing::RealShapeExecutor ex;
  ex.gemm = [](const kernels::GemmArgs& h, const std::vector<std::pair<int64_t, int64_t>>&, kernels::GemmTiling tiling) {
    DeviceBuffers d;
    kernels::GemmArgs g = h;
    // The extent of a strided view: its last element's offset + 1.
    g.A = d.copy(h.A, (h.M - 1) * h.a_row + (h.K - 1) * h.a_col + 1);
    g.B = d.copy(h.B, (h.K - 1) * h.b_row + (h.N - 1) * h.b_col + 1);
    g.C = d.empty<float>((h.M - 1) * h.ldc + h.N);
    kernels::gemm_exact_device(g, tiling);
    copy_back(h.C, g.C, (h.M - 1) * h.ldc + h.N);
  };
  ex.attention_forward = [](const kernels::AttentionArgs& h, const testing::AttentionSample&) {
    DeviceBuffers d;
    const int64_t qn = h.B * h.T * h.H * h.hd, kn = h.B * h.T * h.KV * h.hd, stats = h.B * h.H * h.T;
    kernels::AttentionArgs a = h;
    a.q = d.copy(h.q, qn), a.k = d.copy(h.k, kn), a.v = d.copy(h.v, kn);
    a.out = d.empty<float>(qn), a.row_max = d.empty<float>(stats), a.row_sum = d.empty<float>(stats);
    a.scratch = d.empty<float>(kernels::attention_scratch_rows(a) * a.T);
    kernels::attention_forward_device(a);
    copy_back(h.out, a.out, qn), copy_back(h.row_max, a.row_max, stats), copy_back(h.row_sum, a.row_sum, stats);
  };
  ex.attention_backward = [](const kernels::AttentionArgs& h, const testing::AttentionSample&) {
    DeviceBuffers d;
    const int64_t qn = h.B * h.T * h.H * h.hd, kn = h.B * h.T * h.KV * h.hd, stats = h.B * h.H * h.T;
    kernels::AttentionArgs a = h;
    a.q = d.copy(h.q, qn), a.k = d.copy(h.k, kn), a.v = d.copy(h.v, kn), a.out = d.copy(h.out, qn);
    a.row_max = d.copy(h.row_max, stats), a.row_sum = d.copy(h.row_sum, stats), a.dout = d.copy(h.dout, qn);
    a.dq = d.empty<float>(qn), a.dk = d.empty<float>(kn), a.dv = d.empty<float>(kn);
    a.row_d = d.empty<float>(stats);
    a.dk_head = d.empty<float>(stats * a.hd), a.dv_head = d.empty<float>(stats * a.hd);
    kernels::attention_backward_device(a);
    copy_back(h.dq, a.dq, qn), copy_back(h.dk, a.dk, kn), copy_back(h.dv, a.dv, kn);
  };
  ex.cross_entropy = [](const kernels::LossArgs& h) {
    DeviceBuffers d;
    kernels::LossArgs a = h;
    a.logits = d.copy(h.logits, h.R * h.V), a.tokens = d.copy(h.tokens, h.t0 + h.R);
    a.ce_terms = d.empty<double>(h.R), a.z_terms = d.empty<double>(h.R);
    a.ce_total = d.empty<double>(h.R / h.T), a.z_total = d.empty<double>(h.R / h.T);
    kernels::cross_entropy_device(a);
    copy_back(h.logits, a.logits, h.R * h.V), copy_back(h.ce_terms, a.ce_terms, h.R), copy_back(h.z_terms, a.z_terms, h.R);
    copy_back(h.ce_total, a.ce_total, h.R / h.T), copy_back(h.z_total, a.z_total, h.R / h.T);
  };
  ThreadPool pool(0);
  return testing::check_real_shapes(ex, &pool);
}

// Whole micro-batches of the model through the device executor (kernels/executor.h, device memory) against the
// CPU executor: the same cases tests/kernels/test_executor.cpp runs through the host execution in CI.
int check_model() {
  int failed = 0;
  CpuExecutor cpu;
  kernels::KernelExecutor gpu(true);
  for (const testing::ModelCase& mc : testing::model_cases()) {
    const std::string diff =
        testing::model_runs_differ(testing::run_model_case(mc, cpu), testing::run_model_case(mc, gpu), ParamLayout(mc.cfg));
    std::printf("model d_model %lld %s: %s\n", (long long)mc.cfg.d_model, mc.precision == Precision::bf16 ? "bf16" : "fp32",
                diff.empty() ? "bitwise equal" : ("DIFFERS: " + diff).c_str());
    failed += !diff.empty();
  }
  return failed;
}

}  // namespace

// The mixture of experts' dispatch, combine, input-gradient gather and shared-expert mix (kernels/elementwise.h)
// against ref/moe.cpp on the cases of tests/kernels/moe_cases.h.
int check_moe() {
  int failed = 0, n_cases = 0;
  for (const testing::MoECase& c : testing::moe_cases()) {
    const int64_t R = c.R, d = c.d, k = c.k, S = R * k;
    std::vector<float> xg(c.y.size()), out(c.x.size()), dx = c.dx0, dsh(c.x.size()), drt(c.x.size());
    const MoEDispatch host_view = moe::dispatch_of(c.plan);
    moe::gather(c.x.data(), host_view, d, xg.data(), nullptr);
    moe::combine(c.y.data(), c.weight.data(), host_view, d, out.data(), nullptr);
    moe::scatter_add(c.dxg.data(), host_view, d, dx.data(), nullptr);
    moe::shared_combine(c.shared.data(), out.data(), k, out.data(), R * d, nullptr);
    moe::shared_combine_backward(c.shared.data(), k, dsh.data(), drt.data(), R * d, nullptr);
    int64_t *dRow = to_device(c.plan.row_of), *dPos = to_device(c.plan.position);
    const MoEDispatch view{R, k, dRow, dPos};
    float *dX = to_device(c.x), *dY = to_device(c.y), *dW = to_device(c.weight), *dDXG = to_device(c.dxg);
    float *dDX = to_device(c.dx0), *dSH = to_device(c.shared), *dXG = to_device(std::vector<float>(xg.size()));
    float *dOut = to_device(std::vector<float>(out.size())), *dDSH = to_device(std::vector<float>(out.size()));
    float* dDRT = to_device(std::vector<float>(out.size()));
    const float div = static_cast<float>(k + 1), alpha = moe_routed_share(k);
    kernels::run_device(kernels::MoEDispatchOp{view, dX, dXG, d}, S * d);
    kernels::run_device(kernels::MoECombineOp{view, dY, dW, dOut, d}, R * d);
    kernels::run_device(kernels::MoEScatterAddOp{view, dDXG, dDX, d}, R * d);
    kernels::run_device(kernels::MoESharedCombineOp{dSH, dOut, dOut, div, alpha}, R * d);
    kernels::run_device(kernels::MoESharedCombineBackwardOp{dSH, dDSH, dDRT, div, alpha}, R * d);
    check_cuda(cudaDeviceSynchronize(), __LINE__);
    const bool ok = bits_equal(from_device(dXG, xg.size()), xg) && bits_equal(from_device(dOut, out.size()), out) &&
                    bits_equal(from_device(dDX, dx.size()), dx) && bits_equal(from_device(dDSH, dsh.size()), dsh) &&
                    bits_equal(from_device(dDRT, drt.size()), drt);
    if (!ok)
      std::printf("moe ops E=%lld k=%lld R=%lld d=%lld: DIFFERENT\n", static_cast<long long>(c.E),
                  static_cast<long long>(k), static_cast<long long>(R), static_cast<long long>(d));
    failed += !ok, ++n_cases;
    cudaFree(dRow), cudaFree(dPos);
    for (float* q : {dX, dY, dW, dDXG, dDX, dSH, dXG, dOut, dDSH, dDRT}) cudaFree(q);
  }
  std::printf("moe dispatch, combine, scatter_add, shared_combine: %d of %d cases bitwise equal\n", n_cases - failed,
              n_cases);
  return failed;
}

// Every MoE op through the device executor (device memory) against the CPU executor, the routing (moe_route,
// moe_router_backward on tied logits) and the combine's backward included: the sequences the cuda-host test runs in
// CI (tests/kernels/test_executor.cpp), with the same runners (tests/kernels/moe_cases.h).
int check_moe_executor() {
  int failed = 0, n_cases = 0;
  CpuExecutor cpu;
  kernels::KernelExecutor gpu(true);
  auto same = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    for (size_t t = 0; t < a.size(); ++t)
      if (!bits_equal(a[t], b[t])) return false;
    return true;
  };
  for (const testing::MoECase& c : testing::moe_cases()) {
    const bool ok = same(testing::run_moe_ops(cpu, c), testing::run_moe_ops(gpu, c));
    if (!ok)
      std::printf("moe executor ops E=%lld k=%lld R=%lld d=%lld: DIFFERENT\n", (long long)c.E, (long long)c.k,
                  (long long)c.R, (long long)c.d);
    failed += !ok, ++n_cases;
  }
  for (const testing::MoERouteCase& c : testing::moe_route_cases()) {
    const bool ok = same(testing::run_moe_routing(cpu, c), testing::run_moe_routing(gpu, c));
    if (!ok)
      std::printf("moe routing E=%lld k=%lld normalize_p=%d lb_rows=%lld: DIFFERENT\n", (long long)c.E, (long long)c.k,
                  c.normalize_p, (long long)c.lb_rows);
    failed += !ok, ++n_cases;
  }
  std::printf("moe executor (dispatch, combine and its backward, scatter_add, shared mix, route, router backward): %d "
              "of %d cases bitwise equal\n", n_cases - failed, n_cases);
  return failed;
}

// kernels::StreamScope: the executor's ops queued on a side stream from the calling thread (what dist::SideStream::run
// does on a device: the owners' adds under NCCL's overlapped exchange), ordered by events against the default
// stream's kernels. A 64 MiB add on the side stream after a scale on the default one and before a copy there: the
// copy must see both; and the default stream is the current one again after the scope.
static int check_streams() {
  kernels::KernelExecutor gpu(true);
  const int64_t n = int64_t{16} << 20;
  std::vector<float> x(static_cast<size_t>(n)), got(x.size());
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 8191) * 0.125f;
  Buffer<float> a(gpu, n, "stream check: a"), b(gpu, n, "stream check: b"), c(gpu, n, "stream check: c");
  a.upload(x.data(), n), b.upload(x.data(), n);
  kernels::SideStream side;
  gpu.scale(a.data(), 2.0f, n);  // default stream: a = 2x
  side.wait_for_default();
  {
    const kernels::StreamScope on_side(side.stream());
    if (kernels::StreamScope::current() != side.stream())
      return std::printf("streams: FAILED: inside the scope the current stream is not the side stream\n"), 1;
    gpu.tree_add(b.data(), a.data(), n);  // side stream: b = x + 2x, exact
  }
  if (kernels::StreamScope::current() != nullptr)
    return std::printf("streams: FAILED: after the scope the current stream is not the default one\n"), 1;
  side.default_waits();
  gpu.copy(c.data(), b.data(), static_cast<size_t>(n) * sizeof(float));
  c.download(got.data(), n);
  for (int64_t i = 0; i < n; ++i)
    if (got[static_cast<size_t>(i)] != 3.0f * x[static_cast<size_t>(i)])
      return std::printf("streams: FAILED: an add queued on a side stream: element %lld is %a, want %a\n",
                         static_cast<long long>(i), static_cast<double>(got[static_cast<size_t>(i)]),
                         static_cast<double>(3.0f * x[static_cast<size_t>(i)])), 1;
  std::printf("streams: the executor's ops on a side stream (kernels::StreamScope), ordered by events: bitwise equal\n");
  return 0;
}

// test_gpu_kernels [--no-math-sweep] [--no-real-shapes] [--no-held] [--only NAME,NAME...] [--parse-only]: every kernel
// family against the CPU, bit for bit. --parse-only reads the rest and exits, touching no device: tools/gpu_check.sh's
// dry run checks the device run's command lines with it.
// Output is line-buffered (a crash or a timeout still leaves every line before it in the log) and an exception in
// one family is reported as that family's failure, and the next family runs.
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool no_math_sweep = false;  // for the sanitizers: the math sweep is long and has no shared memory
  bool no_real_shapes = false;  // for the sanitizers too: gigabytes of operands, minutes under memcheck
  bool parse_only = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-math-sweep") == 0) {
      no_math_sweep = true;
    } else if (std::strcmp(argv[i], "--no-real-shapes") == 0) {
      no_real_shapes = true;
    } else if (std::strcmp(argv[i], "--no-held") == 0) {
      g_no_held = true;
    } else if (std::strcmp(argv[i], "--parse-only") == 0) {
      parse_only = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only.append(",").append(argv[++i]).append(",");
    } else {
      std::fprintf(stderr, "usage: test_gpu_kernels [--no-math-sweep] [--no-real-shapes] [--no-held] [--only NAME,...] "
                   "[--parse-only]; unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const std::pair<const char*, int (*)()> families[] = {
      {"gemm", check_gemm},       {"gemm_swiglu", check_gemm_swiglu}, {"rmsnorm", check_rmsnorm},
      {"fused_norm", check_fused_norm}, {"split_reductions", check_split_reductions}, {"elementwise", check_elementwise}, {"loss", check_loss},
      {"embed_rope", check_embed_rope}, {"attention", check_attention}, {"moe", check_moe}, {"moe_executor", check_moe_executor},
      {"model", check_model},     {"streams", check_streams}, {"real_shapes", check_real_shapes}, {"math", check_math}};
  if (parse_only) {
    // Every name --only lists must be a family (the run itself fails only when none is).
    for (size_t at = 1; at < only.size();) {
      const size_t end = only.find(',', at);
      const std::string name = only.substr(at, end - at);
      at = end + 1;
      if (name.empty()) continue;
      bool known = false;
      for (const auto& [family, check] : families) known = known || name == family;
      if (!known) {
        std::fprintf(stderr, "test_gpu_kernels: --only names '%s', which is no kernel family\n", name.c_str());
        return 2;
      }
    }
    std::printf("test_gpu_kernels: arguments read (--parse-only: no device touched)\n");
    return 0;
  }
  const cuda::DeviceInfo dev = cuda::query_device();
  if (!dev.available) {
    std::printf("SKIPPED: no CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
  const long long resident = kernels::attention_forward_resident_blocks();
  std::printf("device: %s, sm_%d%d, %d SMs; attention forward: %lld blocks at once (%lld per SM)\n", dev.name.c_str(),
              dev.compute_major, dev.compute_minor, dev.sm_count, resident, resident / std::max(dev.sm_count, 1));
  int failed = 0, ran = 0;
  for (const auto& [name, check] : families) {
    std::string needle = ",";  // built in steps: GCC 12's -Wrestrict misreads "," + std::string(name) + ","
    needle.append(name).append(",");
    if (!only.empty() && only.find(needle) == std::string::npos) continue;
    if (no_math_sweep && std::strcmp(name, "math") == 0) continue;
    if (no_real_shapes && std::strcmp(name, "real_shapes") == 0) continue;
    ++ran;
    try {
      failed += check() != 0;
    } catch (const std::exception& e) {
      std::printf("%s: FAILED with an exception: %s\n", name, e.what());
      ++failed;
      cudaGetLastError();  // a sticky error stays; the next family reports its own
    }
  }
  if (ran == 0) {
    std::printf("FAILED: --only %s names no kernel family\n", only.c_str());
    return 2;
  }
  std::printf(failed ? "FAILED\n" : "OK: every kernel bitwise equal to the CPU\n");
  return failed ? 1 : 0;
}
