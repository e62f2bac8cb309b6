// bench/bench_ckpt.cpp — checkpoint save/load throughput and size, on a real training state.
//
//   build/bench/bench_ckpt CKPT_DIR LEVEL THREADS RAW_OUT
// Loads CKPT_DIR (e.g. the demo's runs/demo/checkpoints/step00000200), then times ckpt::save and
// ckpt::load of that state (best of 5) and writes the raw fp32 vectors (params, m, v) to RAW_OUT so
// bench/ckpt_bench.sh can time the zstd command-line tool on exactly the same bytes.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/checkpoint.h"

using namespace olmoref;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s CKPT_DIR LEVEL THREADS RAW_OUT\n", argv[0]);
    return 2;
  }
  const std::string src = argv[1], raw_out = argv[4];
  const int level = std::atoi(argv[2]), threads = std::atoi(argv[3]);
  std::ifstream mf(src + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(mf);
  const int64_t n = m.at("total_params").get<int64_t>();
  std::vector<float> p(n), a(n), b(n);
  ckpt::CheckpointMeta meta = ckpt::load(src, {n, p.data(), a.data(), b.data()}, {}, {});
  std::vector<ckpt::Segment> segments;
  // One segment per 1M floats: tensor granularity does not matter for throughput.
  for (int64_t off = 0; off < n; off += 1 << 20) segments.push_back({"part", off, std::min<int64_t>(1 << 20, n - off)});
  ckpt::SaveOptions opts;
  opts.zstd_level = level;
  opts.zstd_threads = threads;
  opts.keep_last = 1;
  const std::string root = fs::temp_directory_path() / ("olmoref-bench-ckpt-" + std::to_string(::getpid()));
  const double raw_mb = 3.0 * n * 4 / 1e6;
  double best_save = 1e30, best_load = 1e30;
  std::string dir;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    dir = ckpt::save(root, meta, {n, p.data(), a.data(), b.data()}, segments, opts);
    const auto t1 = std::chrono::steady_clock::now();
    ckpt::load(dir, {n, p.data(), a.data(), b.data()}, {}, {});
    const auto t2 = std::chrono::steady_clock::now();
    best_save = std::min(best_save, std::chrono::duration<double>(t1 - t0).count());
    best_load = std::min(best_load, std::chrono::duration<double>(t2 - t1).count());
  }
  int64_t stored = 0;
  for (const auto& e : fs::directory_iterator(dir)) stored += static_cast<int64_t>(fs::file_size(e.path()));
  std::printf("olmoref save  %8.1f MB/s   load %8.1f MB/s   (%.1f MB raw state, %.1f MB stored, ratio %.3f, level %d, %d thread(s))\n",
              raw_mb / best_save, raw_mb / best_load, raw_mb, stored / 1e6, stored / 1e6 / raw_mb, level, threads);
  std::ofstream raw(raw_out, std::ios::binary);
  for (auto* v : {&p, &a, &b}) raw.write(reinterpret_cast<const char*>(v->data()), static_cast<std::streamsize>(n * 4));
  fs::remove_all(root);
  return 0;
}
