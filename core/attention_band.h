// core/attention_band.h — the keys a query sees (docs/canonical/attention.md, documents.md), for every attention
// implementation (ref/ops.cpp, ref/simd_ops_impl.h, kernels/attention_exact.h): one definition of the band.
//
// Query i of instance b sees keys j in [attention_key_lo(i), i]: the sliding window (w keys counting the query; 0:
// full causal) and, under intra-document masking, nothing before its document's first position. Key j is seen by
// queries i in [j, attention_query_hi(j)]: the window and the end of its document. doc_start and doc_end are each
// position's document's first and last position, [B, T] (core/documents.h), or null: one document per instance.
// Both bounds are non-decreasing in i (and j), which the tiled kernels use: a tile's lowest key is its first row's
// attention_key_lo, its last query its last key's attention_query_hi.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace olmoref {

OLMOREF_HD inline int64_t attention_key_lo(int64_t window, const int32_t* doc_start, int64_t T, int64_t b, int64_t i) {
  int64_t lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
  if (doc_start && doc_start[b * T + i] > lo) lo = doc_start[b * T + i];
  return lo;
}

OLMOREF_HD inline int64_t attention_query_hi(int64_t window, const int32_t* doc_end, int64_t T, int64_t b, int64_t j) {
  int64_t hi = window > 0 && j + window - 1 < T - 1 ? j + window - 1 : T - 1;
  if (doc_end && doc_end[b * T + j] < hi) hi = doc_end[b * T + j];
  return hi;
}

// The queries whose P and dS an attention backward over a part of the instance computes (AttentionShape's q_begin ..
// k_end, ends resolved): [begin, end), the hull of the queries whose dq it writes, [q_begin, q_end), and of those
// that see its keys, [k_begin, attention_query_hi(k_end − 1)] (the bound is non-decreasing in j). Empty parts add
// nothing; both empty: begin >= end.
struct AttentionQueries {
  int64_t begin, end;
};
OLMOREF_HD inline AttentionQueries attention_backward_queries(int64_t window, const int32_t* doc_end, int64_t T,
                                                              int64_t b, int64_t q_begin, int64_t q_end,
                                                              int64_t k_begin, int64_t k_end) {
  AttentionQueries r{T, 0};
  if (q_begin < q_end) r.begin = q_begin, r.end = q_end;
  if (k_begin < k_end) {
    const int64_t hi = attention_query_hi(window, doc_end, T, b, k_end - 1) + 1;
    if (k_begin < r.begin) r.begin = k_begin;
    if (hi > r.end) r.end = hi;
  }
  return r;
}

}  // namespace olmoref
