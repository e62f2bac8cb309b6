// tests/common/attention_parts.h — the parts of an instance an attention call computes under context parallelism
// (core/op_types.h AttentionShape q_begin .. k_end), and the check that a part writes exactly its rows with the
// whole-instance call's bits. Shared by the reference's (tests/ref/test_simd.cpp), the kernels' host
// (tests/kernels/test_decomposition.cpp) and device (tests/gpu/test_gpu_kernels.cpp) tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace olmoref::testing {

struct AttentionPart {
  int64_t q_begin, q_end, k_begin, k_end;
};

// OLMo-core's llama3 sharding of an instance over n ranks: rank r holds positions [r·T/n, (r+1)·T/n) and computes
// the queries and keys it holds (n = 2, 3, 4); then parts no sharding makes: the first query with the last key,
// keys only, queries only, queries after the keys, a part inside one tile.
inline std::vector<AttentionPart> attention_parts(int64_t T) {
  std::vector<AttentionPart> parts;
  for (const int64_t n : {2, 3, 4})
    for (int64_t r = 0; r < n; ++r) parts.push_back({r * T / n, (r + 1) * T / n, r * T / n, (r + 1) * T / n});
  parts.push_back({0, 1, T - 1, T});
  parts.push_back({T / 3, T / 3, T / 2, T});
  parts.push_back({T / 4, T, T / 2, T / 2});
  parts.push_back({T / 2, T, 0, T / 3});
  parts.push_back({T / 2, T / 2 + 1 < T ? T / 2 + 1 : T, T / 2, T / 2 + 1 < T ? T / 2 + 1 : T});
  return parts;
}

// What an output holds before a part call: a NaN no operation makes, so a row the call writes cannot keep it.
inline constexpr uint32_t kUnwritten = 0x7fa5a5a5u;
inline std::vector<float> unwritten(size_t n) {
  std::vector<float> x(n);
  for (float& e : x) std::memcpy(&e, &kUnwritten, sizeof e);
  return x;
}

// The first element of x [outer, T, inner] that is wrong, or -1: at positions [begin, end) it must have want's bits,
// elsewhere still kUnwritten.
inline int64_t first_wrong_part(const std::vector<float>& x, const std::vector<float>& want, int64_t T, int64_t inner,
                                int64_t begin, int64_t end) {
  if (x.size() != want.size()) return 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const int64_t t = static_cast<int64_t>(e) / inner % T;
    uint32_t got, expect = kUnwritten;
    std::memcpy(&got, &x[e], sizeof got);
    if (t >= begin && t < end) std::memcpy(&expect, &want[e], sizeof expect);
    if (got != expect) return static_cast<int64_t>(e);
  }
  return -1;
}

// An attention forward's and backward's outputs (host copies): out, dq [B·T, H·hd]; the row statistics [B, H, T];
// dk, dv [B·T, KV·hd].
struct AttentionOutputs {
  std::vector<float> out, row_max, row_sum, dq, dk, dv;
};
// kUnwritten outputs for a part call to write into.
inline AttentionOutputs unwritten_outputs(size_t qn, size_t stats, size_t kn) {
  return {unwritten(qn), unwritten(stats), unwritten(stats), unwritten(qn), unwritten(kn), unwritten(kn)};
}

// The first output of a call over `part` that is wrong against the whole instance's (first_wrong_part: the part's
// queries for out, the statistics and dq, its keys for dk and dv), or "" when every one is right.
inline std::string wrong_part_output(const AttentionOutputs& got, const AttentionOutputs& whole, int64_t T, int64_t qw,
                                     int64_t kw, const AttentionPart& part) {
  struct Output {
    const char* name;
    const std::vector<float> AttentionOutputs::*tensor;
    int64_t inner;
    bool keys;
  };
  const Output outputs[] = {{"out", &AttentionOutputs::out, qw, false},       {"row_max", &AttentionOutputs::row_max, 1, false},
                            {"row_sum", &AttentionOutputs::row_sum, 1, false}, {"dq", &AttentionOutputs::dq, qw, false},
                            {"dk", &AttentionOutputs::dk, kw, true},           {"dv", &AttentionOutputs::dv, kw, true}};
  for (const Output& o : outputs) {
    const int64_t begin = o.keys ? part.k_begin : part.q_begin, end = o.keys ? part.k_end : part.q_end;
    if (first_wrong_part(got.*o.tensor, whole.*o.tensor, T, o.inner, begin, end) != -1) return o.name;
  }
  return "";
}

}  // namespace olmoref::testing
