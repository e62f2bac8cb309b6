// tests/data/data_test_util.h — temporary directories and token files for the data tests.
#pragma once

#include <doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "tests/common/test_util.h"

namespace olmoref::data::testing {

// A fresh directory under $TMPDIR, removed when the object dies.
struct TempDir : ::olmoref::testing::TempDir {
  TempDir() : ::olmoref::testing::TempDir("data-test") {}
};

// Writes raw bytes (any size, for the malformed-file tests).
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_tokens(const std::string& path, const std::vector<uint32_t>& tokens, Dtype dtype) {
  TokenFileWriter w(path, dtype);
  w.write(tokens);
  w.close();
}

// Tokens whose value encodes (file, position) so any mix-up of files or offsets shows:
// token i of file f is (f * 1000 + i) % modulo.
inline std::vector<uint32_t> pattern_tokens(int64_t n, uint32_t file, uint32_t modulo) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint32_t>((file * 1000u + i) % modulo);
  return t;
}

}  // namespace olmoref::data::testing
