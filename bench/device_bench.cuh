// bench/device_bench.cuh — what the device benches share (bench/gemm_bench.cu, bench/attention_bench.cu): timing a
// call with CUDA events, and bench.json rows appended as each is measured, so a run cut short keeps the rows before it.
#pragma once

#include <cuda_runtime.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace olmoref::bench {

// NVIDIA H200 SXM datasheet (nvidia.com/en-us/data-center/h200, "FP32: 67 TFLOPS"; the H100 SXM's is the same):
// dense fp32 on the CUDA cores, the ceiling of an exact FFMA chain and of cublasSgemm without TF32.
// bench/gpu_bench.sh uses the same figure.
constexpr double kFp32PeakTflops = 67.0;

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("bench: ") + what + ": " + cudaGetErrorString(err));
}

// Seconds per call: one warm-up call, then repeats until 0.2 s or 20 calls have passed (at least 2).
template <class Call>
double seconds_per_call(Call&& call) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  call();
  check_cuda(cudaDeviceSynchronize(), "warm-up call");
  int calls = 0;
  float ms = 0.0f;
  check_cuda(cudaEventRecord(start), "cudaEventRecord");
  while (calls < 2 || (ms < 200.0f && calls < 20)) {
    call();
    ++calls;
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "a timed call");
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / calls;
}

// Appends one row to the JSON array in `path` (created when missing), through a temporary file and a rename.
inline void append_row(const std::string& path, const std::string& row) {
  std::string text;
  if (std::ifstream in(path); in) text.assign(std::istreambuf_iterator<char>(in), {});
  const size_t close = text.rfind(']');
  if (close == std::string::npos || text.find('[') > close) {
    text = "[\n" + row + "\n]\n";
  } else {
    text.resize(close);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    text += (text.back() == '[' ? "\n" : ",\n") + row + "\n]\n";
  }
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("bench: cannot write " + path);
}

// The device benches' command line: NAME [--dry-run] [--out BENCH_JSON] [CONFIG.toml...], the defaults when no
// config is named. False (after printing the usage to stderr) on an unknown argument.
struct Args {
  bool dry = false;
  std::string out;
  std::vector<std::string> configs;
};
inline bool parse_args(int argc, char** argv, const char* name, std::vector<std::string> defaults, Args& args) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dry-run") == 0) {
      args.dry = true;
    } else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      args.out = argv[++i];
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [--dry-run] [--out BENCH_JSON] [CONFIG.toml...]; unknown argument %s\n", name,
                   argv[i]);
      return false;
    } else {
      args.configs.push_back(argv[i]);
    }
  }
  if (args.configs.empty()) args.configs = std::move(defaults);
  return true;
}

inline std::string json_number(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%.6g", x);
  return s;
}

// Operands of small integers times `scale`: exact in fp32, the same on every run.
static __global__ void fill(float* x, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = scale * float(int(i % 13) - 6);
}

}  // namespace olmoref::bench
