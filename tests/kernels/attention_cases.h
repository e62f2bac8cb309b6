// tests/kernels/attention_cases.h — attention shapes shared by the host-decomposition and GPU tests: GQA,
// window 1, a window longer than the sequence, full causal, odd head dims, head dims past one staged chunk of 128,
// one-token sequences, bf16, and documents inside the instances (intra-document masking, docs/canonical/documents.md).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/documents.h"
#include "kernels/attention_exact.h"
#include "core/bf16.h"
#include "ref/ops.h"
#include "tests/common/attention_parts.h"

namespace olmoref::testing {

struct AttentionCase {
  int64_t B, T, H, KV, hd, window;
  bool bf16;
  uint32_t docs = 0;  // 0: one document per instance; else the seed of documents of random lengths
};
inline std::vector<AttentionCase> attention_cases() {
  return {{1, 1, 1, 1, 4, 0, false},   {2, 37, 4, 2, 8, 1, false},  {1, 37, 4, 2, 8, 50, false},
          {2, 40, 4, 4, 6, 16, false}, {1, 70, 6, 2, 5, 0, false},  {1, 45, 4, 2, 8, 16, true},
          {1, 33, 2, 1, 40, 7, false},  {1, 40, 2, 1, 136, 9, false}, {1, 35, 2, 2, 160, 0, true},
          // Documents: with a window, full causal (documents spanning key tiles), bf16, head dims past a chunk.
          {2, 70, 4, 2, 8, 16, false, 1}, {2, 75, 4, 2, 8, 0, false, 2}, {1, 45, 4, 2, 8, 9, true, 3},
          {1, 40, 2, 1, 136, 0, false, 4}};
}
// Sequences past a thousand keys, more query rows than the kernels' blocks in flight: full causal fp32, GQA with a
// window and bf16.
inline std::vector<AttentionCase> long_attention_cases() {
  return {{1, 1100, 4, 2, 8, 0, false}, {1, 1100, 4, 1, 16, 300, true}};
}
// The cases the context-parallel parts run on (tests/common/attention_parts.h; host and device): GQA with window 1,
// bf16 with a window, head dims past a chunk, documents with a window and full causal.
inline std::vector<AttentionCase> part_attention_cases() {
  return {{2, 37, 4, 2, 8, 1, false}, {1, 45, 4, 2, 8, 16, true}, {1, 40, 2, 1, 136, 9, false},
          {2, 70, 4, 2, 8, 16, false, 1}, {2, 75, 4, 2, 8, 0, false, 2}};
}
struct AttentionOperands {
  std::vector<float> q, k, v;
  std::vector<int32_t> doc_start, doc_end;  // [B, T] when the case has documents
};
// Each instance's documents from tokens with EOS (core/documents.h), so the boundaries are the data path's: EOS at
// random positions (about one in eight), and in the first instance also at the last position and twice in a row.
inline void attention_documents(const AttentionCase& c, AttentionOperands& o) {
  if (!c.docs) return;
  std::mt19937 rng(c.docs);
  constexpr uint32_t kEos = 1;
  for (int64_t b = 0; b < c.B; ++b) {
    std::vector<uint32_t> tokens(static_cast<size_t>(c.T), 2);
    for (uint32_t& t : tokens)
      if (rng() % 8 == 0) t = kEos;
    if (b == 0 && c.T > 8) tokens[3] = tokens[4] = tokens[static_cast<size_t>(c.T - 1)] = kEos;
    const DocumentPositions p = document_positions(tokens.data(), c.T, kEos);
    o.doc_start.insert(o.doc_start.end(), p.start.begin(), p.start.end());
    o.doc_end.insert(o.doc_end.end(), p.end.begin(), p.end.end());
  }
}
inline AttentionOperands attention_operands(const AttentionCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  AttentionOperands o;
  auto fill = [&](std::vector<float>& x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x.push_back(c.bf16 ? round_bf16(nd(rng)) : nd(rng));
  };
  fill(o.q, c.B * c.T * c.H * c.hd);
  fill(o.k, c.B * c.T * c.KV * c.hd);
  fill(o.v, c.B * c.T * c.KV * c.hd);
  attention_documents(c, o);
  return o;
}
inline AttentionShape attention_shape(const AttentionCase& c) {
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.window, 1.0f / std::sqrt(static_cast<float>(c.hd))};
  s.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
  return s;
}
// With the operands' documents (host memory), when the case has them.
inline AttentionShape attention_shape(const AttentionCase& c, const AttentionOperands& o) {
  AttentionShape s = attention_shape(c);
  if (!o.doc_start.empty()) s.doc_start = o.doc_start.data(), s.doc_end = o.doc_end.data();
  return s;
}

// The kernel arguments of a case (shape fields only; the caller sets the pointers).
// The whole instance's attention by the reference (ref/ops.h, forward then backward from ∂out `dout`): what every part
// of it must reproduce bit for bit.
inline AttentionOutputs whole_instance_outputs(const AttentionCase& c, const AttentionOperands& o,
                                               const std::vector<float>& dout) {
  const size_t qn = static_cast<size_t>(c.B * c.T * c.H * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
  const size_t stats = static_cast<size_t>(c.B * c.H * c.T);
  const AttentionShape shape = attention_shape(c, o);
  AttentionOutputs whole{std::vector<float>(qn), std::vector<float>(stats), std::vector<float>(stats),
                         std::vector<float>(qn), std::vector<float>(kn),    std::vector<float>(kn)};
  attention_forward(shape, o.q.data(), o.k.data(), o.v.data(), whole.out.data(), whole.row_max.data(),
                    whole.row_sum.data(), nullptr);
  attention_backward(shape, o.q.data(), o.k.data(), o.v.data(), whole.out.data(), whole.row_max.data(),
                     whole.row_sum.data(), dout.data(), whole.dq.data(), whole.dk.data(), whole.dv.data(), nullptr);
  return whole;
}

inline kernels::AttentionArgs attention_args(const AttentionCase& c) {
  kernels::AttentionArgs a;
  a.B = c.B, a.T = c.T, a.H = c.H, a.KV = c.KV, a.hd = c.hd, a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.bf16 = c.bf16;
  return a;
}
inline kernels::AttentionArgs attention_args(const AttentionCase& c, const AttentionOperands& o) {
  kernels::AttentionArgs a = attention_args(c);
  if (!o.doc_start.empty()) a.doc_start = o.doc_start.data(), a.doc_end = o.doc_end.data();
  return a;
}

}  // namespace olmoref::testing
