// core/documents.h — the documents inside one packed instance, as OLMo-core's intra-document masking sees them
// (docs/canonical/documents.md). ai2-olmo-core 3.0.0, read from its code:
//   - olmo_core.data.utils.get_document_lengths(input_ids, eos_token_id) (no BOS): a document ends AT each EOS,
//     the EOS its last token, and the instance's end ends the last one (an instance ending in EOS gets no empty
//     document after it; consecutive EOS make one-token documents);
//   - the model then takes get_cumulative_document_lengths over the batch, so an instance boundary is always a
//     document boundary, and with those boundaries
//       attention: query i sees key j only inside its own document (flash-attn varlen: cu_seqlens), and on a
//                  sliding-window layer only within the window too: j in [max(start(i), i - w + 1), i];
//       RoPE:      RotaryEmbedding(cu_doc_lens=...) rotates position i by i - start(i), its position in its
//                  document (olmo_core/nn/rope.py: pos_idx = flat_idx - cu_doc_lens[doc_id]), not by i.
// Nothing here is used unless data.document_masking is on; with it off every instance is one document and both
// reduce to plain causal attention and RoPE at i.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace olmoref {

// get_document_lengths of one instance tokens[T]: the lengths, in order, summing to T.
inline std::vector<int32_t> document_lengths(const uint32_t* tokens, int64_t T, uint32_t eos) {
  if (T < 1) throw std::invalid_argument("document_lengths: an instance of no tokens");
  std::vector<int32_t> lengths;
  int64_t start = 0;
  for (int64_t i = 0; i < T; ++i)
    if (tokens[i] == eos || i == T - 1) {
      lengths.push_back(static_cast<int32_t>(i + 1 - start));
      start = i + 1;
    }
  return lengths;
}

// Per position i of one instance: the first and last position of i's document (attention's lowest key, and the
// last query that sees i) and i's position in its document (RoPE's), each [T].
struct DocumentPositions {
  std::vector<int32_t> start, end;
  std::vector<int32_t> rope_position;
};

inline DocumentPositions document_positions(const uint32_t* tokens, int64_t T, uint32_t eos) {
  DocumentPositions p;
  p.start.reserve(static_cast<size_t>(T));
  p.end.reserve(static_cast<size_t>(T));
  p.rope_position.reserve(static_cast<size_t>(T));
  int32_t at = 0;
  for (const int32_t len : document_lengths(tokens, T, eos)) {
    for (int32_t k = 0; k < len; ++k) {
      p.start.push_back(at);
      p.end.push_back(at + len - 1);
      p.rope_position.push_back(k);
    }
    at += len;
  }
  return p;
}

}  // namespace olmoref
