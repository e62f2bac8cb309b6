// tests/data/leak_fixture.h — a synthetic corpus for the leakage detector tests: documents of
// uniformly random tokens (no n-gram is shared between two documents by chance), so every overlap
// the detector finds was put there by a test.
#pragma once

#include <doctest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/token_file.h"
#include "tests/common/test_util.h"

namespace olmoref::leaktest {

inline constexpr uint32_t kEos = 999;
inline constexpr int64_t kVocab = 1000;

// Documents of random tokens in [0, 999) with lengths in [20, 80], each ending in EOS, until at
// least n tokens.
inline std::vector<uint32_t> random_documents(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t;
  while (static_cast<int64_t>(t.size()) < n) {
    const uint32_t len = 20 + rng() % 61;
    for (uint32_t i = 0; i < len; ++i) t.push_back(rng() % kEos);
    t.push_back(kEos);
  }
  return t;
}

struct TempDir : ::olmoref::testing::TempDir {
  explicit TempDir(const std::string& name) : ::olmoref::testing::TempDir("leak-" + name) {}
};

inline std::string write_u16(const std::string& path, const std::vector<uint32_t>& tokens) {
  data::TokenFileWriter w(path, data::Dtype::u16);
  w.write(tokens);
  w.close();
  return path;
}

// Three training files, one holdout file, one fresh file, all of random documents.
struct Corpus {
  TempDir dir{"corpus"};
  std::vector<std::string> train, holdout, fresh;
  Corpus(int64_t train_tokens_per_file = 4200, int64_t holdout_tokens = 2000) {
    for (int f = 0; f < 3; ++f)
      train.push_back(write_u16(dir.file("train-" + std::to_string(f) + ".u16"),
                                random_documents(train_tokens_per_file, 100 + static_cast<uint32_t>(f))));
    holdout.push_back(write_u16(dir.file("holdout-0.u16"), random_documents(holdout_tokens, 7)));
    fresh.push_back(write_u16(dir.file("fresh-0.u16"), random_documents(holdout_tokens, 8)));
  }
};

inline data::LoaderConfig loader_config(const Corpus& c, int64_t seq_len = 64, int64_t global_batch = 8,
                                        int64_t micro_batch = 2) {
  data::DatasetOptions o;
  o.sequence_length = seq_len;
  o.vocab_size = kVocab;
  o.dtype = data::Dtype::u16;
  o.eos_id = kEos;
  data::LoaderConfig lc;
  lc.dataset = std::make_shared<data::FslDataset>(data::Mix::from_paths(c.train), o);
  lc.seed = data::kOlmoCoreDefaultSeed;
  lc.global_batch_instances = global_batch;
  lc.microbatch_instances = micro_batch;
  lc.holdout = data::HoldoutSpec::separate(data::Mix::from_paths(c.holdout));
  return lc;
}

}  // namespace olmoref::leaktest
