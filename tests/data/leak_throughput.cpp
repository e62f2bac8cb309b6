// tests/data/leak_throughput.cpp — figures for the n-gram check of `olmoref leakcheck`: scan
// throughput on a large synthetic stream, memory per million holdout n-grams, and how the scan
// splits over processes. Not a test (it asserts nothing but its own hit count); run it by hand:
//
//   build/tests/data/leak_throughput [--tokens 1e9] [--holdout-ngrams 1e6] [--threads 2] [--bloom]
//                                    [--seq-len 2048] [--n 8] [--part K --parts P]
//
// The stream is `--tokens` uniformly random token ids (vocabulary 100352, Olmo 3's), cut into
// instances of --seq-len; the holdout is random 500-token documents with `--holdout-ngrams`
// n-grams in all, 1000 of which are copied into the stream (they must all be found). The kernel is
// exactly the probe leakcheck runs per instance: NgramHasher::hash_all then NgramSet::probe (data/ngram.h), at the
// seed length n = 8 of its matcher (data/leak_match.h; the hits it then extends are rare on unrelated text).
// With --parts P the process scans only part K of the stream (the split a rank of a P-rank job
// scans: its own micro-batches); under mpirun the part comes from OMPI_COMM_WORLD_RANK/SIZE, e.g.
//   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 4
//     build/tests/data/leak_throughput --tokens 1e9 --threads 1
// Each process prints one line; the job's throughput is the total tokens over the slowest process.
//
// End to end (through the loader, every check): --write-corpus DIR writes `--tokens` tokens of
// random documents (uint16, EOS 65535) as DIR/train-*.u16, a holdout DIR/holdout.u16 of about
// `--holdout-ngrams` 13-grams (20 of its documents also copied into training), and DIR/leak.toml
// (sequence length 2048, global batch 64), then exits; run
//   build/olmoref leakcheck --config DIR/leak.toml --epoch [--no-audit-checks] [--bloom]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/ngram.h"
#include "data/token_file.h"
#include "core/parallel.h"

using namespace olmoref;
using namespace olmoref::data;

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double arg(int argc, char** argv, const char* name, double def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return def;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// Random documents (200-2000 tokens of ids < 65535, then EOS 65535) for the end-to-end corpus.
void write_docs(const std::string& path, int64_t n, uint64_t seed, std::vector<uint32_t>* keep = nullptr) {
  TokenFileWriter w(path, Dtype::u16);
  std::vector<uint32_t> buf;
  int64_t written = 0;
  uint64_t c = seed << 40;
  while (written < n) {
    const int64_t len = 200 + static_cast<int64_t>(splitmix(c++) % 1801);
    for (int64_t i = 0; i < len; ++i) buf.push_back(static_cast<uint32_t>(splitmix(c++) % 65535));
    buf.push_back(65535);
    written += len + 1;
    if (buf.size() > (1u << 20) || written >= n) {
      w.write(buf);
      if (keep) keep->insert(keep->end(), buf.begin(), buf.end());
      buf.clear();
    }
  }
  w.close();
}

int write_corpus(const std::string& dir, int64_t total, int64_t holdout_ngrams) {
  std::filesystem::create_directories(dir);
  std::vector<uint32_t> holdout;
  write_docs(dir + "/holdout.u16", holdout_ngrams, 999, &holdout);
  // 20 holdout documents (the 2nd..21st) go into the first training file: a leak to find.
  std::vector<uint32_t> leaked;
  int docs = 0;
  for (size_t i = 0; i < holdout.size() && docs <= 20; ++i) {
    if (docs >= 1) leaked.push_back(holdout[i]);
    if (holdout[i] == 65535) ++docs;
  }
  std::string files;
  const int64_t per_file = int64_t{100} << 20;
  for (int64_t f = 0; f * per_file < total; ++f) {
    const std::string p = dir + "/train-" + std::to_string(f) + ".u16";
    write_docs(p, std::min(per_file, total - f * per_file), static_cast<uint64_t>(f + 1));
    if (f == 0) {  // append the leaked documents
      TokenFile old(p, Dtype::u16);
      std::vector<uint32_t> t(static_cast<size_t>(old.n_tokens()));
      old.read(0, t, 0);
      t.insert(t.end(), leaked.begin(), leaked.end());
      TokenFileWriter w(p, Dtype::u16);
      w.write(t);
      w.close();
    }
    files += std::string(files.empty() ? "" : ", ") + "\"" + p + "\"";
  }
  std::FILE* c = std::fopen((dir + "/leak.toml").c_str(), "w");
  std::fprintf(c,
               "# written by leak_throughput --write-corpus: a synthetic corpus for `olmoref leakcheck`\n"
               "[model]\nname = \"leak-bench\"\nvocab_size = 65536\nd_model = 64\nn_layers = 1\nn_heads = 4\n"
               "ffn_hidden = 128\nswa_pattern = [-1]\n\n[train]\nseq_len = 2048\nmicro_batch_instances = 8\n"
               "global_batch_instances = 64\nsteps = 100\n\n[data]\ntrain_files = [%s]\n"
               "holdout_files = [\"%s/holdout.u16\"]\ndtype = \"u16\"\neos_id = 65535\n",
               files.c_str(), dir.c_str());
  std::fclose(c);
  std::printf("wrote %s: %.3g training tokens, %zu holdout tokens (20 documents leaked into train-0.u16), %s/leak.toml\n",
              dir.c_str(), static_cast<double>(total), holdout.size(), dir.c_str());
  return 0;
}

const char* sarg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* dir = sarg(argc, argv, "--write-corpus"))
    return write_corpus(dir, static_cast<int64_t>(arg(argc, argv, "--tokens", 1e9)),
                        static_cast<int64_t>(arg(argc, argv, "--holdout-ngrams", 1e6)));
  const int64_t total = static_cast<int64_t>(arg(argc, argv, "--tokens", 1e9));
  const int64_t holdout_ngrams = static_cast<int64_t>(arg(argc, argv, "--holdout-ngrams", 1e6));
  const int threads = static_cast<int>(arg(argc, argv, "--threads", 2));
  const int64_t L = static_cast<int64_t>(arg(argc, argv, "--seq-len", 2048));
  const int n = static_cast<int>(arg(argc, argv, "--n", 8));
  const bool bloom = flag(argc, argv, "--bloom");
  int part = static_cast<int>(arg(argc, argv, "--part", 0)), parts = static_cast<int>(arg(argc, argv, "--parts", 1));
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) part = std::atoi(r);
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) parts = std::atoi(s);
  constexpr uint32_t kVocab = 100352;

  // Holdout: random documents of 500 tokens.
  const int64_t doc_len = 500, per_doc = doc_len - n + 1;
  const int64_t docs = (holdout_ngrams + per_doc - 1) / per_doc;
  std::vector<uint32_t> holdout(static_cast<size_t>(docs * doc_len));
  for (size_t i = 0; i < holdout.size(); ++i) holdout[i] = static_cast<uint32_t>(splitmix(i ^ 0xABCDEF1234ull) % kVocab);
  const NgramHasher hasher(n);
  const auto t_build = std::chrono::steady_clock::now();
  NgramSet set(bloom ? NgramSet::Kind::bloom : NgramSet::Kind::exact, docs * per_doc);
  {
    std::vector<uint64_t> keys(static_cast<size_t>(doc_len)), scratch;
    for (int64_t d = 0; d < docs; ++d) {
      const size_t c = hasher.hash_all(std::span<const uint32_t>(holdout).subspan(static_cast<size_t>(d * doc_len), static_cast<size_t>(doc_len)),
                                       keys.data(), scratch);
      for (size_t i = 0; i < c; ++i) set.insert(keys[i]);
    }
  }
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();

  // This process's part of the stream: whole instances [i0, i1).
  const int64_t instances = total / L, i0 = instances * part / parts, i1 = instances * (part + 1) / parts;
  const int64_t tokens = (i1 - i0) * L;
  std::vector<uint32_t> stream(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i)
    stream[static_cast<size_t>(i)] = static_cast<uint32_t>(splitmix(static_cast<uint64_t>(i0 * L + i)) % kVocab);
  // Plant 1000 holdout n-grams (of the whole stream; this part keeps those that fall in it), each
  // inside one instance.
  int64_t planted = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    const int64_t inst = static_cast<int64_t>(splitmix(k * 3 + 1) % static_cast<uint64_t>(instances));
    if (inst < i0 || inst >= i1) continue;
    const int64_t off = static_cast<int64_t>(splitmix(k * 3 + 2) % static_cast<uint64_t>(L - n + 1));
    const int64_t src = static_cast<int64_t>(splitmix(k * 3 + 3) % static_cast<uint64_t>(docs)) * doc_len;
    std::memcpy(&stream[static_cast<size_t>((inst - i0) * L + off)], &holdout[static_cast<size_t>(src)], n * sizeof(uint32_t));
    ++planted;
  }

  ThreadPool pool(threads);
  std::vector<int64_t> hits(static_cast<size_t>(pool.size()), 0);
  const int64_t P = pool.size(), M = i1 - i0;
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(P, 1, [&](int64_t p0, int64_t p1) {
    std::vector<uint64_t> keys(static_cast<size_t>(L)), scratch;
    for (int64_t p = p0; p < p1; ++p) {
      int64_t h = 0;
      for (int64_t i = M * p / P; i < M * (p + 1) / P; ++i) {
        const size_t c = hasher.hash_all(std::span<const uint32_t>(stream).subspan(static_cast<size_t>(i * L), static_cast<size_t>(L)),
                                         keys.data(), scratch);
        set.probe(keys.data(), c, [&](size_t) { ++h; });
      }
      hits[static_cast<size_t>(p)] = h;
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t found = 0;
  for (const int64_t h : hits) found += h;
  std::printf("part %d/%d: %s set, %.2fM holdout n-grams (%.1f MiB = %.1f MB per million n-grams, built in %.2f s); "
              "%.3g tokens, %d thread(s): %.3f s = %.3g tokens/s; %lld hits (%lld planted%s)\n",
              part, parts, bloom ? "Bloom" : "exact", static_cast<double>(docs * per_doc) / 1e6,
              static_cast<double>(set.bytes()) / (1 << 20),
              static_cast<double>(set.bytes()) / 1e6 / (static_cast<double>(docs * per_doc) / 1e6), build_s,
              static_cast<double>(tokens), pool.size(), s, static_cast<double>(tokens) / s, static_cast<long long>(found),
              static_cast<long long>(planted), bloom ? ", Bloom may add false positives" : "");
  return found >= planted ? 0 : 1;
}
