// bench/attention_bench.cu — the exact attention kernels (kernels/attention_exact.h) on the attention shapes of a
// training step, on the device, as launched and held to one block an SM (run by tools/gpu_check.sh's bench step,
// after bench/gemm_bench).
//
//   attention_bench [--dry-run] [--out BENCH_JSON] [CONFIG.toml...]
//                   (default configs/olmo3-100m.toml configs/olmo3-1b.toml configs/olmo3-7b.toml)
//
// Shapes: for each config, one micro-batch (micro_batch_instances x seq_len) of each attention its layers use (a
// sliding window, full causal), fp32. Each prints and appends to BENCH_JSON (the rows' format of bench/gemm_bench.cu,
// "bench": "attention") the seconds and TFLOP/s of the forward and of the backward (FLOPs as `train --profile-ops`
// counts them: 4·hd a (query, key) pair the forward, twice that the backward), the three tile kernels' registers and
// blocks an SM on this device, and the same launches held to one block an SM (dynamic shared memory they never touch,
// the forward's grid capped at the SMs: the same bits, which gpu-kernels checks), so a row says what the second block
// an SM buys each half. Held so the SM also gives more of its L1 to shared memory: the ratio bounds occupancy's share
// from above. The operands are not attention-like (small integers): the kernels' work does not depend on the values.
// --dry-run builds and prints the shape list without touching a device (the dry run of tools/gpu_check.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/device_bench.cuh"
#include "kernels/attention_exact.h"
#include "model/profiled_executor.h"
#include "train/config.h"

namespace {

using namespace olmoref;

struct Shape {
  std::string config, attention;
  kernels::AttentionArgs args;  // shapes only; the buffers are set at the run
  double forward_flops = 0, backward_flops = 0;
};

std::vector<Shape> step_shapes(const std::string& path) {
  const TrainConfig cfg = load_config(path);
  const ModelConfig& m = cfg.model;
  std::string name = path.substr(path.find_last_of('/') + 1);
  name = name.substr(0, name.rfind(".toml"));
  std::set<int64_t> windows;
  for (int64_t l = 0; l < m.n_layers; ++l) windows.insert(m.window(l));
  std::vector<Shape> shapes;
  for (const int64_t window : windows) {
    Shape s{name, window == 0 ? "full causal" : "sliding window " + std::to_string(window), {}};
    kernels::AttentionArgs& a = s.args;
    a.B = cfg.train.micro_batch_instances, a.T = cfg.train.seq_len, a.H = m.n_heads, a.KV = m.n_kv_heads;
    a.hd = m.head_dim, a.window = window, a.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
    const AttentionShape shape{a.B, a.T, a.H, a.KV, a.hd, a.window, a.scale};
    const double pairs = attention_query_pairs(shape, 0, a.T), hd = static_cast<double>(a.hd);
    s.forward_flops = 4.0 * pairs * hd;
    s.backward_flops = 4.0 * (pairs + attention_key_pairs(shape, 0, a.T)) * hd;
    shapes.push_back(s);
  }
  return shapes;
}

// The buffers of the largest shape, reused by every shape (each reads and writes only its own extent).
struct Buffers {
  float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *row_max = nullptr, *row_sum = nullptr;
  float *scratch = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *row_d = nullptr;
  float *dk_head = nullptr, *dv_head = nullptr;
  std::vector<float*> all;
  float* make(int64_t n, float scale) {
    float* p = nullptr;
    bench::check_cuda(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)), "cudaMalloc");
    bench::fill<<<1024, 256>>>(p, n, scale);
    all.push_back(p);
    return p;
  }
  ~Buffers() {
    for (float* p : all) cudaFree(p);
  }
};

std::string bench_shape(const Shape& s, const kernels::AttentionDeviceFit& fit, const Buffers& b) {
  kernels::AttentionArgs a = s.args;
  a.q = b.q, a.k = b.k, a.v = b.v, a.out = b.out, a.row_max = b.row_max, a.row_sum = b.row_sum, a.scratch = b.scratch;
  a.tile_blocks = std::min(a.tile_blocks, kernels::attention_forward_resident_blocks());  // as the executor launches
  a.dout = b.dout, a.dq = b.dq, a.dk = b.dk, a.dv = b.dv, a.row_d = b.row_d, a.dk_head = b.dk_head, a.dv_head = b.dv_head;
  kernels::attention_forward_device(a);  // out, row_max, row_sum for the backward
  const double forward = bench::seconds_per_call([&] { kernels::attention_forward_device(a); });
  const double backward = bench::seconds_per_call([&] { kernels::attention_backward_device(a); });
  const double forward_held =
      bench::seconds_per_call([&] { kernels::attention_forward_device_one_block_per_sm(a); });
  const double backward_held =
      bench::seconds_per_call([&] { kernels::attention_backward_device_one_block_per_sm(a); });
  const double f_tflops = s.forward_flops / forward / 1e12, b_tflops = s.backward_flops / backward / 1e12;
  std::ostringstream row;
  row << " {\"bench\": \"attention\", \"config\": \"" << s.config << "\", \"attention\": \"" << s.attention
      << "\", \"B\": " << a.B << ", \"T\": " << a.T << ", \"H\": " << a.H << ", \"KV\": " << a.KV << ", \"hd\": " << a.hd
      << ", \"window\": " << a.window << ", \"peak_tflops\": " << bench::json_number(bench::kFp32PeakTflops)
      << ", \"forward_flops\": " << bench::json_number(s.forward_flops)
      << ", \"backward_flops\": " << bench::json_number(s.backward_flops)
      << ", \"forward_seconds\": " << bench::json_number(forward) << ", \"forward_tflops\": " << bench::json_number(f_tflops)
      << ", \"backward_seconds\": " << bench::json_number(backward)
      << ", \"backward_tflops\": " << bench::json_number(b_tflops)
      << ", \"forward_one_block_per_sm_seconds\": " << bench::json_number(forward_held)
      << ", \"backward_one_block_per_sm_seconds\": " << bench::json_number(backward_held)
      << ", \"forward_over_one_block_per_sm\": " << bench::json_number(forward_held / forward)
      << ", \"backward_over_one_block_per_sm\": " << bench::json_number(backward_held / backward)
      << ", \"forward_registers\": " << fit.forward_registers
      << ", \"forward_blocks_per_sm\": " << fit.forward_blocks_per_sm
      << ", \"query_registers\": " << fit.query_registers << ", \"query_blocks_per_sm\": " << fit.query_blocks_per_sm
      << ", \"key_registers\": " << fit.key_registers << ", \"key_blocks_per_sm\": " << fit.key_blocks_per_sm << "}";
  std::printf("%-11s %-22s B %lld T %5lld H %2lld hd %3lld  forward %6.2f TFLOP/s (%.2fx 1 block/SM)  backward %6.2f "
              "TFLOP/s (%.2fx 1 block/SM)\n",
              s.config.c_str(), s.attention.c_str(), (long long)a.B, (long long)a.T, (long long)a.H, (long long)a.hd,
              f_tflops, forward_held / forward, b_tflops, backward_held / backward);
  return row.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Args args;
  const std::vector<std::string> defaults = {"configs/olmo3-100m.toml", "configs/olmo3-1b.toml", "configs/olmo3-7b.toml"};
  if (!bench::parse_args(argc, argv, "attention_bench", defaults, args)) return 2;
  try {
    std::vector<Shape> shapes;
    for (const std::string& c : args.configs)
      for (Shape& s : step_shapes(c)) shapes.push_back(std::move(s));
    if (args.dry) {
      std::printf("attention_bench --dry-run: %zu shapes, no device used\n", shapes.size());
      for (const Shape& s : shapes)
        std::printf("  %-11s %-22s B %lld T %5lld H %2lld KV %2lld hd %3lld  forward %.1f GFLOP, backward %.1f GFLOP\n",
                    s.config.c_str(), s.attention.c_str(), (long long)s.args.B, (long long)s.args.T,
                    (long long)s.args.H, (long long)s.args.KV, (long long)s.args.hd, s.forward_flops / 1e9,
                    s.backward_flops / 1e9);
      return 0;
    }
    int64_t q = 0, kv = 0, stats = 0, scratch = 0;
    for (const Shape& s : shapes) {
      const kernels::AttentionArgs& a = s.args;
      q = std::max(q, a.B * a.T * a.H * a.hd), kv = std::max(kv, a.B * a.T * a.KV * a.hd);
      stats = std::max(stats, a.B * a.H * a.T), scratch = std::max(scratch, kernels::attention_scratch_rows(a) * a.T);
    }
    Buffers b;
    b.q = b.make(q, 0.125f), b.k = b.make(kv, 0.0625f), b.v = b.make(kv, 0.25f), b.out = b.make(q, 0);
    b.row_max = b.make(stats, 0), b.row_sum = b.make(stats, 0), b.scratch = b.make(scratch, 0);
    b.dout = b.make(q, 0.03125f), b.dq = b.make(q, 0), b.dk = b.make(kv, 0), b.dv = b.make(kv, 0);
    b.row_d = b.make(stats, 0), b.dk_head = b.make(q, 0), b.dv_head = b.make(q, 0);
    bench::check_cuda(cudaDeviceSynchronize(), "fill");
    const kernels::AttentionDeviceFit fit = kernels::attention_device_fit();
    std::printf("attention_bench: forward %d registers, %d blocks an SM; backward query %d, %d; key %d, %d\n",
                fit.forward_registers, fit.forward_blocks_per_sm, fit.query_registers, fit.query_blocks_per_sm,
                fit.key_registers, fit.key_blocks_per_sm);
    for (const Shape& s : shapes) {
      const std::string row = bench_shape(s, fit, b);
      if (!args.out.empty()) bench::append_row(args.out, row);
    }
  } catch (const std::exception& e) {
    std::printf("attention_bench: FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
