// tests/common/test_util.h — what many test programs need and none owns: a scratch directory and the message of
// a refusal (the tests check that errors name the file, key and fix).
#pragma once

#include <doctest.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

namespace olmoref::testing {

// A fresh directory $TMPDIR/olmoref-PREFIX-XXXXXX, removed with everything in it when the object dies.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string templ = (std::filesystem::temp_directory_path() / ("olmoref-" + prefix + "-XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr) FAIL("mkdtemp failed for " << templ);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// What `fn` throws (its what()), or "" when it returns.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace olmoref::testing
