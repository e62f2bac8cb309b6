// bench/bench_ckpt_synthetic.cpp — a checkpoint of a model too large to train here, for measuring the tools that
// read checkpoints (`ckpt verify`, `export-hf`) at scale (bench/ckpt_verify.sh).
//
//   build/bench/bench_ckpt_synthetic CONFIG.toml ROOT [LEVEL] [THREADS] [KEY=VALUE ...]
// Writes ROOT/step00000000 holding CONFIG's model (KEY=VALUE: overrides, as train --set): the parameters are its
// init, the moments made up from them (m = 1e-3 x the init, v = m^2, so the moments compress like a trained run's do
// not: a worst case for size). The state is never held: write_shard asks for each frame in file order, which is
// computed then and fed to a running digest per vector, so this runs in a few tens of MiB for any model. When the
// config names data files that exist, the manifest records the loader at its start as `olmoref train` would, so
// `train --resume-from ROOT/step00000000 --stop-after 0` resumes it (a resume without a step: bench/ckpt_io_1b.sh).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/params.h"
#include "golden/digest.h"
#include "model/init.h"
#include "train/batch_source.h"
#include "train/config.h"

using namespace olmoref;

namespace {
bool dataset_instances_exist(const TrainConfig& cfg) {
  for (const std::string& f : cfg.data.train_files)
    if (!std::filesystem::exists(f)) return false;
  return !cfg.data.train_files.empty();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CONFIG.toml ROOT [LEVEL] [THREADS] [KEY=VALUE ...]\n", argv[0]);
    return 2;
  }
  const TrainConfig cfg = load_config(argv[1], std::vector<std::string>(argv + std::min(argc, 5), argv + argc));
  const ParamLayout layout(cfg.model);
  const int64_t n = layout.total;
  ckpt::SaveOptions opts;
  opts.zstd_level = argc > 3 ? std::atoi(argv[3]) : 3;
  opts.zstd_threads = argc > 4 ? std::atoi(argv[4]) : 2;
  opts.keep_last = 1;
  std::vector<ckpt::Segment> segments;
  for (const ParamInfo& p : layout.params) segments.push_back({p.name, p.offset, p.numel});
  MerkleStream digests[3];
  ckpt::ShardContents all;
  all.ranges = {{{0, n}, {0, n}, {0, n}}};
  // Frames come in file order (each vector from element 0 up), so each vector's digest is fed in order.
  all.read = [&](int v, int64_t a, int64_t b, float* scratch) -> const float* {
    init_params_range(cfg.model, layout, a, b, scratch);
    if (v > 0)
      for (int64_t i = 0; i < b - a; ++i) {
        const float m = 1e-3f * scratch[i];
        scratch[i] = v == 1 ? m : m * m;
      }
    digests[v].add(scratch, b - a);
    return scratch;
  };
  ckpt::CheckpointMeta meta;
  meta.step = 0;
  meta.config_toml = cfg.to_toml();
  meta.resume_hash = cfg.resume_hash();
  meta.model_hash = cfg.model_hash();
  meta.loader_state = nlohmann::json::object();  // no data: a state nothing can resume
  meta.data_layout = {{"seq_len", cfg.train.seq_len}, {"synthetic", true}};
  if (dataset_instances_exist(cfg)) {  // the loader at its start, recorded as the trainer records it
    const std::unique_ptr<BatchSource> source = make_batch_source(cfg);
    meta.loader_state = source->state();
    meta.dataset_fingerprint = source->fingerprint();
    meta.data_layout = {{"seq_len", cfg.train.seq_len},
                        {"micro_batch_instances", cfg.train.micro_batch_instances},
                        {"global_batch_instances", cfg.train.global_batch_instances},
                        {"dp_shard", 1}, {"dp_replicate", 1}, {"ep", 1}};
  }
  meta.precision = "fp32";
  meta.executor = "cpu";
  meta.extra = {{"synthetic", "bench/bench_ckpt_synthetic.cpp: init parameters, m = 1e-3 x init, v = m^2"}};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string tmp = ckpt::begin_save(argv[2], 0, true);
  const ckpt::ShardRecord record = ckpt::write_shard(tmp, 0, all, segments, opts, 0);
  const ckpt::StateDigests d{digests[0].finish().hex(), digests[1].finish().hex(), digests[2].finish().hex()};
  const std::string dir = ckpt::finish_save(argv[2], tmp, meta, n, d, opts, {record});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %lld parameters, %.2f GB raw, %.2f GB stored, written in %.1f s (level %d, %d thread(s))\n",
              dir.c_str(), static_cast<long long>(n), 12.0 * static_cast<double>(n) / 1e9,
              static_cast<double>(record.bytes) / 1e9, s, opts.zstd_level, opts.zstd_threads);
  return 0;
}
