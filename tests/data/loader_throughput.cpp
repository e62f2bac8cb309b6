// tests/data/loader_throughput.cpp — loader throughput against a plain sequential read of the
// same bytes. Not a test (nothing to assert); run it by hand:
//
//   build/tests/data/loader_throughput [--dir /tmp/olmoref-loader-bench] [--gib 2] [--files 4]
//                                      [--seq-len 2048] [--global-batch 64] [--dtype uint32]
//
// It writes `--files` synthetic token files totalling `--gib` GiB (kept for reuse), then measures
//  1. a sequential read() of every file in 4 MiB blocks (the ceiling for moving these bytes),
//  2. the loader over one whole epoch (shuffled instances, widened to uint32, ids checked),
//  3. the same with the audit log on (XXH3 per instance + one JSON line each),
// both with the files in the page cache ("warm") and, where posix_fadvise(DONTNEED) can evict
// them, straight from disk ("cold"). The global order (numpy-exact shuffle) is timed separately.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/audit.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shuffle.h"
#include "data/token_file.h"

using namespace olmoref::data;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void evict(const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

double sequential_read(const std::vector<std::string>& paths, int64_t& bytes) {
  std::vector<char> buf(4 << 20);
  bytes = 0;
  uint64_t sink = 0;
  const double t0 = now_s();
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + p);
    ssize_t n;
    while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
      bytes += n;
      sink += static_cast<unsigned char>(buf[static_cast<size_t>(n) - 1]);
    }
    ::close(fd);
  }
  const double t = now_s() - t0;
  if (sink == 42) std::printf(" ");  // keep the reads observable
  return t;
}

struct LoaderRun {
  double seconds;
  int64_t instances;
  int64_t bytes;  // bytes of the token files read (instances * seq_len * dtype size)
};

// Opens its own dataset: pages mapped by an earlier run would stay resident (fadvise cannot
// evict mapped pages) and make a "cold" run warm.
LoaderRun loader_epoch(const Mix& mix, const DatasetOptions& o, int64_t global_batch, std::shared_ptr<AuditLog> audit) {
  auto ds = std::make_shared<FslDataset>(mix, o);
  LoaderConfig c;
  c.dataset = ds;
  c.global_batch_instances = global_batch;
  c.microbatch_instances = 1;
  c.audit = std::move(audit);
  Loader loader(c);  // builds the epoch-1 order (timed separately below)
  GlobalBatch b;
  const double t0 = now_s();
  for (int64_t s = 0; s < loader.batches_per_epoch(); ++s) loader.next_batch(b);
  if (c.audit) c.audit->flush();
  const double t = now_s() - t0;
  const int64_t inst = loader.batches_per_epoch() * global_batch;
  return {t, inst, inst * ds->sequence_length() * dtype_size(ds->dtype())};
}

void report(const char* what, double seconds, int64_t instances, int64_t bytes) {
  std::printf("  %-34s %8.3f s  %12.0f instances/s  %7.2f GB/s\n", what, seconds,
              instances > 0 ? double(instances) / seconds : 0.0, double(bytes) / seconds / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = (fs::temp_directory_path() / "olmoref-loader-bench").string();
  double gib = 2.0;
  int files = 4;
  int64_t seq_len = 2048, global_batch = 64;
  Dtype dtype = Dtype::u32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--gib") gib = std::stod(v);
    else if (k == "--files") files = std::stoi(v);
    else if (k == "--seq-len") seq_len = std::stoll(v);
    else if (k == "--global-batch") global_batch = std::stoll(v);
    else if (k == "--dtype") dtype = parse_dtype(v);
    else {
      std::fprintf(stderr, "unknown option %s (see the comment at the top of loader_throughput.cpp)\n", k.c_str());
      return 2;
    }
  }
  fs::create_directories(dir);
  const int64_t bytes_per_file = static_cast<int64_t>(gib * double(int64_t{1} << 30) / files) /
                                 dtype_size(dtype) * dtype_size(dtype);
  const int64_t tokens_per_file = bytes_per_file / dtype_size(dtype);
  std::vector<std::string> paths;
  for (int f = 0; f < files; ++f) {
    paths.push_back(dir + "/bench-" + dtype_name(dtype) + "-" + std::to_string(f) + ".npy");
    std::error_code ec;
    if (fs::file_size(paths.back(), ec) == static_cast<uintmax_t>(bytes_per_file)) continue;
    std::printf("writing %s (%.2f GiB)\n", paths.back().c_str(), double(bytes_per_file) / double(1 << 30));
    TokenFileWriter w(paths.back(), dtype);
    std::vector<uint32_t> block(1 << 20);
    uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(f + 1);
    for (int64_t done = 0; done < tokens_per_file;) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(block.size()), tokens_per_file - done);
      for (int64_t i = 0; i < n; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        block[static_cast<size_t>(i)] = static_cast<uint32_t>(x % 50000);
      }
      w.write(std::span<const uint32_t>(block.data(), static_cast<size_t>(n)));
      done += n;
    }
    w.close();
  }

  DatasetOptions o;
  o.sequence_length = seq_len;
  o.vocab_size = 50000;
  o.dtype = dtype;
  const Mix mix = Mix::from_paths(paths);
  auto ds = std::make_shared<FslDataset>(mix, o);
  std::printf("dataset: %d files x %.2f GiB %s, %lld instances of %lld tokens, global batch %lld (%lld batches)\n",
              files, double(bytes_per_file) / double(1 << 30), dtype_name(dtype), static_cast<long long>(ds->size()),
              static_cast<long long>(seq_len), static_cast<long long>(global_batch),
              static_cast<long long>(ds->size() / global_batch));

  double t0 = now_s();
  const GlobalOrder order(kOlmoCoreDefaultSeed, 1, ds->size(), global_batch);
  std::printf("global order (PCG64 shuffle of %lld ids): %.4f s\n", static_cast<long long>(ds->size()), now_s() - t0);
  ds.reset();

  const std::string audit_path = dir + "/bench-audit.jsonl";
  for (const bool cold : {false, true}) {
    if (cold) {
      evict(paths);
    } else {
      int64_t b;
      sequential_read(paths, b);  // populate the page cache
    }
    std::printf("%s:\n", cold ? "cold (evicted with posix_fadvise DONTNEED before each run)" : "warm (page cache)");
    int64_t bytes = 0;
    const double ts = sequential_read(paths, bytes);
    report("sequential read() 4 MiB blocks", ts, 0, bytes);
    if (cold) evict(paths);
    const LoaderRun r = loader_epoch(mix, o, global_batch, nullptr);
    report("loader, one epoch", r.seconds, r.instances, r.bytes);
    if (cold) evict(paths);
    const LoaderRun ra = loader_epoch(mix, o, global_batch, std::make_shared<AuditLog>(audit_path));
    report("loader + audit log", ra.seconds, ra.instances, ra.bytes);
  }
  fs::remove(audit_path);
  std::printf("(files kept in %s for reruns; delete them when done)\n", dir.c_str());
  return 0;
}
