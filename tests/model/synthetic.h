// tests/model/synthetic.h — a small learnable token task for tests: documents that are arithmetic
// progressions modulo 500 (random start, step 1, 2 or 3, 20-59 tokens) ending in EOS = 511. A model
// that learns the rule predicts everything but each document's first two tokens; one that only
// learns token frequencies stays near ln(500) = 6.2 nats.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <string>
#include <vector>

#include "train/config.h"

namespace olmoref::testing {

inline std::vector<uint16_t> progression_tokens(int64_t n_docs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> toks;
  for (int64_t d = 0; d < n_docs; ++d) {
    const uint32_t start = rng() % 500, step = 1 + rng() % 3, len = 20 + rng() % 40;
    for (uint32_t i = 0; i < len; ++i) toks.push_back(static_cast<uint16_t>((start + i * step) % 500));
    toks.push_back(511);
  }
  return toks;
}

inline std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("olmoref-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string write_tokens(const std::string& path, const std::vector<uint16_t>& toks) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(toks.data(), sizeof(uint16_t), toks.size(), f);
  std::fclose(f);
  return path;
}

// The shipped tiny config with the synthetic corpus as training data.
inline TrainConfig tiny_config_with_data(const std::string& token_file, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> ov = {"data.train_files=[\"" + token_file + "\"]", "data.dtype=\"u16\""};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return load_config(std::string(OLMOREF_TEST_SOURCE_ROOT) + "/configs/tiny.toml", ov);
}

}  // namespace olmoref::testing
