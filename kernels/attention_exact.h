// kernels/attention_exact.h — sliding-window causal GQA attention in exact mode (docs/canonical/attention.md), one
// source for the CUDA kernels and their host execution.
//
// Every kernel works on tiles of 32 consecutive positions of one (instance, head): 256 threads (8 warps), K and V
// (or Q and dO) staged in shared memory 32 rows x 128 head dims at a time, so each staged value feeds 32 chains.
// A thread of warp w and lane l takes tile rows w, w+8, w+16, w+24 and, for products over keys, key l of the staged
// key tile, or, for outputs over head dims, dims l, l+32, l+64, l+96 of the staged chunk. Every chain is the one
// attention.md defines, in its order: staging and tiling change where operands come from, never an operation.
//
// Forward (a grid of at most kAttentionTileBlocks blocks, dealt the query tiles heaviest first; each block keeps its
// rows' scores in its own scratch [32, T], so scratch is [blocks in flight · 32, T], linear in T where a block per row
// would need [B·H·T, T]: 17 GiB at Olmo 3 7B, seq 8192, micro-batch 2). The key band of the tile, lo(i0) .. its last row, is
// walked in key tiles of 32, ascending:
//  1. scores: one fma chain over d from 0, continued across the 128-dim chunks, times scale; each thread keeps the
//     first occurrence of the largest score of its keys, and a row's 32 threads then pick the largest, the smaller
//     key on ties: what the CPU's sequential max gives, ±0 included, for any split of the keys;
//  2. e_j = expf(s_j − m) and the denominator l: the 32-lane sum with lane (j − lo(i)) mod 32. A key tile holds 32
//     consecutive keys, so each lane of a row gets at most one key per tile, and the tiles go in ascending order:
//     every lane's chain is the reference's, whatever lo(i) − lo(i0) is. Then the lane tree;
//  3. P_j = e_j / l (bf16: rounded) and, per output (row, d), one fma chain over j ascending of P_j·v_jd, carried
//     in registers from key tile to key tile.
// Backward, three kernels in the order of attention.md (the first two one block per tile, heaviest tiles first):
//  (1) a block per query tile: D_i (chain over d of dO·o, kept as [B, H, T]); per key tile the dP and score chains
//      (dO with V staged, then Q with K), P with the forward's very operations from the saved m and l, and
//      dS_j = (P_j·(dP_j − D))·scale with the bf16 roundings (attention_prob_grad); then dq (chain over j per d,
//      from the staged K), carried across key tiles. No dS row is stored.
//  (2) a block per key tile of a query head: the tile's K and V, then for each tile of 32 queries from the first key
//      up to the last key's band, P and dS recomputed by the same function, and per (key, d) the chains of dk and
//      dv over the queries i = j .. hi(j) ascending. No [B·H·T, T] P or dS is ever stored.
//  (3) per KV head the group sum over its query heads in ascending order.
// Head dims past 128 come in further chunks: score and dP chains continue in registers; a dq, dk or dv chain of a
// later chunk goes on through its output row (an fp32 store and reload keeps the bits).
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/attention_band.h"
#include "core/bf16.h"
#include "core/hd.h"
#include "core/mathfn_impl.h"

namespace olmoref::kernels {

inline constexpr int kAttTile = 32;                   // query rows of a tile; keys of a key tile
inline constexpr int kAttThreads = 256;               // 8 warps
inline constexpr int kAttWarps = kAttThreads / 32;
inline constexpr int kAttPer = kAttTile / kAttWarps;  // the tile rows (or keys) of one thread: w + 8u
inline constexpr int kAttChunk = 128;                 // head dims staged at a time
inline constexpr int kAttPerDim = kAttChunk / 32;     // a thread's dims of a chunk: l + 32v
// Staged rows padded to 129 floats: lane l reading row l at dim d hits bank (l + d) mod 32, no conflict.
inline constexpr int kAttPitch = kAttChunk + 1;

// The most blocks in flight over the query tiles in the forward, each with its own 32 scratch rows of T floats: two per
// SM of an H100 or H200 SXM (132 SMs; the forward kernel's 128 registers x 256 threads and 45 KiB of shared memory
// let two share an SM). On a device the executor launches min(this, the blocks the device holds at once), so they
// all run in one wave; the host execution takes this. The scratch is bounded by the shape alone (the memory model's
// figure), and the tiles a block takes never change a bit, since each tile is computed whole by one block. 8,448
// scratch rows: 264 MiB at T = 8192.
inline constexpr int64_t kAttentionTileBlocks = 264;

struct AttentionArgs {
  int64_t B = 0, T = 0, H = 0, KV = 0, hd = 0, window = 0;  // window 0: full causal
  const int32_t *doc_start = nullptr, *doc_end = nullptr;     // [B, T] (core/attention_band.h); null: no documents
  float scale = 1.0f;
  bool bf16 = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // [B·T, H·hd], [B·T, KV·hd] ×2
  float* out = nullptr;                                  // [B·T, H·hd]
  float *row_max = nullptr, *row_sum = nullptr;          // [B, H, T]
  float* scratch = nullptr;  // forward only: [attention_scratch_rows, T], a block's 32 rows of scores, then e
  int64_t tile_blocks = kAttentionTileBlocks;  // at most this many forward blocks (tests take fewer to stride more)
  // backward only
  const float* dout = nullptr;                   // [B·T, H·hd]
  float* dq = nullptr;                           // [B·T, H·hd]
  float *dk = nullptr, *dv = nullptr;            // [B·T, KV·hd]
  float* row_d = nullptr;                        // [B, H, T]: D_i = chain over d of dO_id·o_id
  float *dk_head = nullptr, *dv_head = nullptr;  // [B, H, T, hd]
  // Context parallelism (core/op_types.h AttentionShape): the queries whose out, row statistics and dq, and the keys
  // whose dk and dv are written, in absolute positions; an end of -1 is T. A tile is cut to its part of them, which
  // changes no bit: every chain below is one query's or one key's, and the lanes go by position, not by tile.
  int64_t q_begin = 0, q_end = -1, k_begin = 0, k_end = -1;
};
OLMOREF_HD inline int64_t attention_query_end(const AttentionArgs& a) { return a.q_end < 0 ? a.T : a.q_end; }
OLMOREF_HD inline int64_t attention_key_end(const AttentionArgs& a) { return a.k_end < 0 ? a.T : a.k_end; }

// Tiles of 32 positions over every (instance, head): B·H·ceil(T/32).
OLMOREF_HD inline int64_t attention_tiles(const AttentionArgs& a) { return a.B * a.H * ((a.T + kAttTile - 1) / kAttTile); }
OLMOREF_HD inline int64_t attention_forward_blocks(const AttentionArgs& a) {
  const int64_t tiles = attention_tiles(a);
  return tiles < a.tile_blocks ? tiles : a.tile_blocks;
}
// The forward's scratch rows: [attention_scratch_rows, T].
OLMOREF_HD inline int64_t attention_scratch_rows(const AttentionArgs& a) { return attention_forward_blocks(a) * kAttTile; }

// The order the kernels hand tiles out in, heaviest first, so that no block is left with the long bands at the end:
// rank g of B·H·ceil(T/32) is tile row r of (instance, head) g mod B·H. A query tile's key band grows with its
// position (full causal: row r reads r + 1 key tiles; a sliding window caps it), so queries go from the last row down;
// a key tile's queries shrink with its position, so keys go from row 0 up. A permutation of the tiles: each is still
// computed whole by one block, so the order changes no bit.
OLMOREF_HD inline int64_t attention_tile_by_rank(const AttentionArgs& a, int64_t g, bool queries) {
  // 32-bit division (B·H·ceil(T/32) is far below 2^31): a 64-bit one is a call on the device, whose registers push the
  // forward kernel past its 128 (two blocks an SM) into spilling.
  const uint32_t per = static_cast<uint32_t>((a.T + kAttTile - 1) / kAttTile), bh = static_cast<uint32_t>(a.B * a.H);
  const uint32_t r = static_cast<uint32_t>(g);
  const uint32_t row = queries ? per - 1 - r / bh : r / bh;
  return static_cast<int64_t>(r % bh) * per + row;
}
// The forward's tiles of block `block` of `blocks`, in the order it computes them: the ranks dealt out in a snake,
// round 0 to blocks 0, 1, .., round 1 back from the last block, so that each block's heavy and light tiles pair up
// (Olmo 3 7B, seq 8192, micro-batch 2 on 264 blocks: the most work of a block is 1.00003x the mean on full-causal
// layers, 1.49x with 128 blocks taking every 128th tile in place order; tests/kernels/test_decomposition). Two rounds
// a pass, one loop counter: the kernel stays within 128 registers without spilling (other forms of the same walk
// spilled).
template <class Visit>
OLMOREF_HD void attention_forward_walk(const AttentionArgs& a, int64_t block, int64_t blocks, const Visit& visit) {
  const int64_t tiles = attention_tiles(a);
  for (int64_t base = 0; base < tiles; base += 2 * blocks)
    for (int half = 0; half < 2; ++half) {
      const int64_t g = base + (half == 0 ? block : 2 * blocks - 1 - block);
      if (g < tiles) visit(attention_tile_by_rank(a, g, true));
    }
}

// The first key of query i's band in instance b, and the last query whose band holds key j (core/attention_band.h:
// the window and, under intra-document masking, the document).
OLMOREF_HD inline int64_t attention_band_lo(const AttentionArgs& a, int64_t b, int64_t i) {
  return attention_key_lo(a.window, a.doc_start, a.T, b, i);
}
OLMOREF_HD inline int64_t attention_band_hi(const AttentionArgs& a, int64_t b, int64_t j) {
  return attention_query_hi(a.window, a.doc_end, a.T, b, j);
}
OLMOREF_HD inline bool attention_in_band(const AttentionArgs& a, int64_t b, int64_t i, int64_t j) {
  return j <= i && j >= attention_band_lo(a, b, i);
}

// Tile `tile` = (b·H + h)·ceil(T/32) + i0/32: its instance, heads, positions i0 .. i0 + n − 1, and the operands'
// bases at (b, h): row i of Q is q + i·qw, row j of K is k + j·kw.
struct AttentionTile {
  int64_t b, h, g, i0, n, qw, kw, stats;  // stats: the [B, H, T] index of position 0 of (b, h)
  const float *q, *k, *v, *dout;
  float *out, *dq;
};
OLMOREF_HD inline AttentionTile attention_tile(const AttentionArgs& a, int64_t tile) {
  AttentionTile at;
  const int64_t per = (a.T + kAttTile - 1) / kAttTile, bh = tile / per;
  at.i0 = (tile % per) * kAttTile;
  at.n = a.T - at.i0 < kAttTile ? a.T - at.i0 : kAttTile;
  at.h = bh % a.H;
  at.b = bh / a.H;
  at.g = at.h / (a.H / a.KV);
  at.qw = a.H * a.hd;
  at.kw = a.KV * a.hd;
  at.stats = bh * a.T;
  const int64_t qoff = at.b * a.T * at.qw + at.h * a.hd, koff = at.b * a.T * at.kw + at.g * a.hd;
  at.q = a.q + qoff, at.k = a.k + koff, at.v = a.v + koff;
  at.dout = a.dout ? a.dout + qoff : nullptr;
  at.out = a.out ? a.out + qoff : nullptr;
  at.dq = a.dq ? a.dq + qoff : nullptr;
  return at;
}
// The tile cut to positions [begin, end): n <= 0 when it holds none of them (the block then has nothing to do).
OLMOREF_HD inline AttentionTile attention_tile_part(const AttentionArgs& a, int64_t tile, int64_t begin, int64_t end) {
  AttentionTile at = attention_tile(a, tile);
  const int64_t first = at.i0 > begin ? at.i0 : begin, stop = at.i0 + at.n < end ? at.i0 + at.n : end;
  at.i0 = first;
  at.n = stop - first;
  return at;
}

using AttentionStage = float[kAttTile][kAttPitch];

// Thread t's part of staging rows r0 .. r0+31 (those below `end`) of a matrix with row stride `stride`, dims
// d0 .. d0+dn−1, into buf. Consecutive threads take consecutive dims, so the loads coalesce. Past the end or past
// dn: 0, never read into a chain.
OLMOREF_HD inline void attention_stage(AttentionStage& buf, const float* base, int64_t stride, int64_t r0, int64_t end,
                                       int64_t d0, int dn, int t) {
  for (int e = t; e < kAttTile * kAttChunk; e += kAttThreads) {
    const int r = e / kAttChunk, d = e % kAttChunk;
    buf[r][d] = d < dn && r0 + r < end ? base[(r0 + r) * stride + d0 + d] : 0.0f;
  }
}
OLMOREF_HD inline int attention_chunk_dims(const AttentionArgs& a, int64_t ch) {
  const int64_t left = a.hd - ch * kAttChunk;
  return static_cast<int>(left < kAttChunk ? left : kAttChunk);
}
OLMOREF_HD inline int64_t attention_chunks(const AttentionArgs& a) { return (a.hd + kAttChunk - 1) / kAttChunk; }

// Continues the chains acc[u] over the chunk's dims: acc[u] = Σ_d x[w + 8u][d]·y[key][d] in ascending d (fma(x, y)
// as the reference writes it), starting from 0 at the first chunk.
OLMOREF_HD inline void attention_row_key_chains(const AttentionStage& x, const AttentionStage& y, int w, int key, int dn,
                                                bool first_chunk, float* acc) {
  OLMOREF_UNROLL
  for (int u = 0; u < kAttPer; ++u)
    if (first_chunk) acc[u] = 0.0f;
  for (int d = 0; d < dn; ++d) {
    const float yd = y[key][d];
    OLMOREF_UNROLL
    for (int u = 0; u < kAttPer; ++u) acc[u] = hd_fma(x[w + kAttWarps * u][d], yd, acc[u]);
  }
}

// P and dS of query i at key j, from the finished score chain (before scale), the dP chain, and the saved m, l and
// D = dO·o: P with exactly the forward's operations, so it has the forward's bits. Both backward kernels call this
// one function, so dq and dk/dv see the same bits. bf16: both rounded, as they enter the dq/dk/dv products as bf16
// operands.
struct ProbGrad {
  float p, ds;
};
OLMOREF_HD inline ProbGrad attention_prob_grad(const AttentionArgs& a, float score_chain, float dp, float m, float l,
                                               float D) {
  const float p = det::impl::expf(score_chain * a.scale - m) / l;
  const float ds = (p * (dp - D)) * a.scale;
  return {a.bf16 ? round_bf16(p) : p, a.bf16 ? round_bf16(ds) : ds};
}

// The outputs a thread owns in one chunk of a row-major output (row stride `stride`): rows r0 + w + 8u of the n rows
// from r0, dims col0 + l + 32v of the dn in the chunk. A chain that goes on in a later tile or chunk does so through
// its output (an fp32 store and reload keeps the bits).
struct AttentionChunkOut {
  float* base;
  int64_t stride, r0, n, col0;
  int dn;
  // The rows written, [keep_begin, keep_end) (a backward query tile computes dS for more queries than it writes dq of).
  int64_t keep_begin = 0, keep_end = 0x7fffffffffffffff;
  // Output (u, v) of thread t, or nullptr past the rows, outside the rows kept or past the chunk's dims.
  OLMOREF_HD float* at(int t, int u, int v) const {
    const int row = t / 32 + kAttWarps * u, d = t % 32 + 32 * v;
    const bool kept = r0 + row >= keep_begin && r0 + row < keep_end;
    return row < n && kept && d < dn ? base + (r0 + row) * stride + col0 + d : nullptr;
  }
};
using AttentionChains = float[kAttPer][kAttPerDim];

// Thread t's chains: from 0 at the first tile, else from their stored outputs; 0 past the output (never stored).
OLMOREF_HD inline void attention_chains_start(const AttentionChunkOut& o, int t, bool first_tile, AttentionChains& acc) {
  OLMOREF_UNROLL
  for (int u = 0; u < kAttPer; ++u)
    OLMOREF_UNROLL
    for (int v = 0; v < kAttPerDim; ++v) {
      const float* p = o.at(t, u, v);
      acc[u][v] = first_tile || !p ? 0.0f : *p;
    }
}
// Thread t's chains into their outputs; bf16: rounded, as the chains end.
OLMOREF_HD inline void attention_chains_store(const AttentionChunkOut& o, int t, bool bf16, const AttentionChains& acc) {
  OLMOREF_UNROLL
  for (int u = 0; u < kAttPer; ++u)
    OLMOREF_UNROLL
    for (int v = 0; v < kAttPerDim; ++v)
      if (float* p = o.at(t, u, v)) *p = bf16 ? round_bf16(acc[u][v]) : acc[u][v];
}

// ---- forward ----------------------------------------------------------------------------------------------------

struct AttentionForwardShared {
  AttentionStage a, b;                   // Q / K, then V
  float p[kAttTile][kAttTile + 1];       // [row, key] of the key tile
  float lane[kAttTile][kAttTile + 1];    // [row, lane]: maxima, then the sum's lanes and tree
  // [row, lane]: where each lane's maximum is. Padded like `lane`: the max pick's thread t reads row t, so unpadded
  // a warp's 32 reads of one lane would all fall in one bank (a 32-way conflict).
  int32_t first[kAttTile][kAttTile + 1];
  float m[kAttTile], l[kAttTile];
};
struct AttentionForwardRegs {
  float acc[kAttPer];                 // score chains, rows w + 8u at key l
  float m[kAttPer];                   // the largest score so far of those rows' keys l + 32·kt
  int32_t first[kAttPer];             // its key, from lo(i)
  float o[kAttPer][kAttPerDim];       // P·V chains, rows w + 8u, dims l + 32v of the chunk
};

// Query tile `tile` with the block's scratch s [32, T]: row r's key j at s[r·T + j − lo(i0)].
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_forward_tile(Block& blk, AttentionForwardShared& sh, const AttentionArgs& a, int64_t tile,
                                       float* s) {
  const AttentionTile at = attention_tile_part(a, tile, a.q_begin, attention_query_end(a));
  if (at.n <= 0) return;
  const int64_t lo0 = attention_band_lo(a, at.b, at.i0), last = at.i0 + at.n - 1;
  const int64_t key_tiles = (last - lo0) / kAttTile + 1, chunks = attention_chunks(a);
  constexpr int32_t kNone = 0x7fffffff;
  const float neg_inf = -hd_float(0x7f800000u);
  blk.phase([&](int, AttentionForwardRegs& r) {
    OLMOREF_UNROLL
    for (int u = 0; u < kAttPer; ++u) r.m[u] = neg_inf, r.first[u] = kNone;
  });
  // 1: scores into s, and each thread's first occurrence of the largest.
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = lo0 + kt * kAttTile;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        if (kt == 0 || chunks > 1) attention_stage(sh.a, at.q, at.qw, at.i0, last + 1, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.k, at.kw, k0, last + 1, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionForwardRegs& r) {
        const int w = t / 32, l = t % 32;
        attention_row_key_chains(sh.a, sh.b, w, l, dn, ch == 0, r.acc);
        if (ch + 1 < chunks) return;
        const int64_t j = k0 + l;
        OLMOREF_UNROLL
        for (int u = 0; u < kAttPer; ++u) {
          const int row = w + kAttWarps * u;
          const int64_t i = at.i0 + row;
          if (row >= at.n || !attention_in_band(a, at.b, i, j)) continue;
          const float score = r.acc[u] * a.scale;
          s[row * a.T + (j - lo0)] = score;
          if (r.m[u] < score) r.m[u] = score, r.first[u] = static_cast<int32_t>(j - attention_band_lo(a, at.b, i));
        }
      });
    }
  }
  blk.phase([&](int t, AttentionForwardRegs& r) {
    const int w = t / 32, l = t % 32;
    OLMOREF_UNROLL
    for (int u = 0; u < kAttPer; ++u) sh.lane[w + kAttWarps * u][l] = r.m[u], sh.first[w + kAttWarps * u][l] = r.first[u];
  });
  blk.phase([&](int t, auto&) {
    if (t >= at.n) return;
    const int64_t i = at.i0 + t, lo = attention_band_lo(a, at.b, i), n = i - lo + 1;
    float m = neg_inf;
    int64_t first = n;
    for (int c = 0; c < kAttTile; ++c)
      if (m < sh.lane[t][c] || (m == sh.lane[t][c] && sh.first[t][c] < first)) m = sh.lane[t][c], first = sh.first[t][c];
    sh.m[t] = first < n ? s[t * a.T + (lo + first - lo0)] : m;  // the score itself, with its sign of zero
  });
  // 2: e = expf(s − m) in place, and the denominator's lanes: thread l holds lane (lo0 + l − lo(i)) mod 32 of row i.
  blk.phase([&](int t, auto&) {
    const int w = t / 32, l = t % 32;
    for (int u = 0; u < kAttPer; ++u) {
      const int row = w + kAttWarps * u;
      if (row >= at.n) {
        sh.lane[row][l] = 0.0f;
        continue;
      }
      const int64_t i = at.i0 + row, lo = attention_band_lo(a, at.b, i);
      float acc = 0.0f;
      for (int64_t j = lo0 + l; j <= i; j += kAttTile) {
        if (j < lo) continue;
        float& e = s[row * a.T + (j - lo0)];
        e = det::impl::expf(e - sh.m[row]);
        acc = acc + e;
      }
      sh.lane[row][((lo0 + l - lo) % kAttTile + kAttTile) % kAttTile] = acc;
    }
  });
  for (int wd = 16; wd >= 1; wd /= 2)  // lane_tree_phases, per row
    blk.phase([&](int t, auto&) {
      for (int e = t; e < kAttTile * wd; e += kAttThreads) sh.lane[e / wd][e % wd] = sh.lane[e / wd][e % wd] + sh.lane[e / wd][e % wd + wd];
    });
  blk.phase([&](int t, auto&) {
    if (t >= at.n) return;
    sh.l[t] = sh.lane[t][0];
    a.row_max[at.stats + at.i0 + t] = sh.m[t];
    a.row_sum[at.stats + at.i0 + t] = sh.l[t];
  });
  // 3: P (bf16: rounded) into the key tile's shared block, and the P·V chains.
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int dn = attention_chunk_dims(a, ch);
    for (int64_t kt = 0; kt < key_tiles; ++kt) {
      const int64_t k0 = lo0 + kt * kAttTile;
      blk.phase([&](int t, auto&) {
        attention_stage(sh.b, at.v, at.kw, k0, last + 1, ch * kAttChunk, dn, t);
        for (int e = t; e < kAttTile * kAttTile; e += kAttThreads) {
          const int row = e / kAttTile, c = e % kAttTile;
          float p = 0.0f;
          if (row < at.n && attention_in_band(a, at.b, at.i0 + row, k0 + c)) {
            p = s[row * a.T + (k0 + c - lo0)] / sh.l[row];
            if (a.bf16) p = round_bf16(p);
          }
          sh.p[row][c] = p;
        }
      });
      blk.phase([&](int t, AttentionForwardRegs& r) {
        const int w = t / 32, l = t % 32;
        const AttentionChunkOut out{at.out, at.qw, at.i0, at.n, ch * kAttChunk, dn};
        if (kt == 0) attention_chains_start(out, t, true, r.o);
        for (int c = 0; c < kAttTile; ++c) {
          const int64_t j = k0 + c;
          float vd[kAttPerDim];
          OLMOREF_UNROLL
          for (int v = 0; v < kAttPerDim; ++v) vd[v] = sh.b[c][l + 32 * v];
          OLMOREF_UNROLL
          for (int u = 0; u < kAttPer; ++u) {
            const int row = w + kAttWarps * u;
            if (row >= at.n || !attention_in_band(a, at.b, at.i0 + row, j)) continue;
            const float p = sh.p[row][c];
            OLMOREF_UNROLL
            for (int v = 0; v < kAttPerDim; ++v) r.o[u][v] = hd_fma(p, vd[v], r.o[u][v]);
          }
        }
        if (kt + 1 == key_tiles) attention_chains_store(out, t, false, r.o);
      });
    }
  }
}

// Block `block` of `blocks` in flight: the query tiles block, block + blocks, ... with scratch rows
// [32·block, 32·block + 32).
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_forward_block(Block& blk, AttentionForwardShared& sh, const AttentionArgs& a, int64_t block,
                                        int64_t blocks) {
  float* s = a.scratch + block * kAttTile * a.T;
  attention_forward_walk(a, block, blocks, [&](int64_t tile) { attention_forward_tile(blk, sh, a, tile, s); });
}

// ---- backward ---------------------------------------------------------------------------------------------------

struct AttentionBackwardShared {
  AttentionStage a, b;
  float p[kAttTile][kAttTile + 1], ds[kAttTile][kAttTile + 1];  // [query, key]
  float m[kAttTile], l[kAttTile], D[kAttTile];                  // of the tile's queries
};
struct AttentionBackwardRegs {
  float dp[kAttPer], score[kAttPer];  // chains of the (query, key) pairs
  float x[kAttPer][kAttPerDim];       // dq chains (query kernel) or dk chains (key kernel)
  float y[kAttPer][kAttPerDim];       // dv chains (key kernel)
};


// Backward (1): query tile `tile`.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_query_tile(Block& blk, AttentionBackwardShared& sh, const AttentionArgs& a,
                                              int64_t tile) {
  // The queries whose P and dS the keys [k_begin, k_end) need besides those whose dq is written: D_i for all of them.
  const int64_t q_end = attention_query_end(a);
  const AttentionQueries rows = attention_backward_queries(a.window, a.doc_end, a.T, attention_tile(a, tile).b,
                                                           a.q_begin, q_end, a.k_begin, attention_key_end(a));
  const AttentionTile at = attention_tile_part(a, tile, rows.begin, rows.end);
  if (at.n <= 0) return;
  const int64_t lo0 = attention_band_lo(a, at.b, at.i0), last = at.i0 + at.n - 1;
  const int64_t key_tiles = (last - lo0) / kAttTile + 1, chunks = attention_chunks(a);
  blk.phase([&](int t, auto&) {
    if (t >= at.n) return;
    const int64_t i = at.i0 + t;
    const float *doi = at.dout + i * at.qw, *oi = at.out + i * at.qw;
    float acc = 0.0f;  // D = chain over d of dO_d·o_d
    for (int64_t d = 0; d < a.hd; ++d) acc = hd_fma(doi[d], oi[d], acc);
    sh.D[t] = acc;
    a.row_d[at.stats + i] = acc;  // for the key kernel's dS
    sh.m[t] = a.row_max[at.stats + i], sh.l[t] = a.row_sum[at.stats + i];
  });
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = lo0 + kt * kAttTile;
    for (int64_t ch = 0; ch < chunks; ++ch) {  // dP: dO and V
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        attention_stage(sh.a, at.dout, at.qw, at.i0, last + 1, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.v, at.kw, k0, last + 1, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionBackwardRegs& r) { attention_row_key_chains(sh.a, sh.b, t / 32, t % 32, dn, ch == 0, r.dp); });
    }
    for (int64_t ch = 0; ch < chunks; ++ch) {  // scores: Q and K (left staged for dq when there is one chunk)
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        attention_stage(sh.a, at.q, at.qw, at.i0, last + 1, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.k, at.kw, k0, last + 1, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionBackwardRegs& r) {
        const int w = t / 32, l = t % 32;
        attention_row_key_chains(sh.a, sh.b, w, l, dn, ch == 0, r.score);
        if (ch + 1 < chunks) return;
        OLMOREF_UNROLL
        for (int u = 0; u < kAttPer; ++u) {
          const int row = w + kAttWarps * u;
          if (row < at.n && attention_in_band(a, at.b, at.i0 + row, k0 + l))
            sh.ds[row][l] = attention_prob_grad(a, r.score[u], r.dp[u], sh.m[row], sh.l[row], sh.D[row]).ds;
        }
      });
    }
    for (int64_t ch = 0; ch < chunks; ++ch) {  // dq = Σ_j dS_j·k_j
      const int dn = attention_chunk_dims(a, ch);
      if (chunks > 1) blk.phase([&](int t, auto&) { attention_stage(sh.b, at.k, at.kw, k0, last + 1, ch * kAttChunk, dn, t); });
      blk.phase([&](int t, AttentionBackwardRegs& r) {
        const int w = t / 32, l = t % 32;
        const bool resident = chunks == 1 && kt > 0, end = kt + 1 == key_tiles;
        const AttentionChunkOut dq{at.dq, at.qw, at.i0, at.n, ch * kAttChunk, dn, a.q_begin, q_end};
        if (!resident) attention_chains_start(dq, t, kt == 0, r.x);
        for (int c = 0; c < kAttTile; ++c) {
          float kd[kAttPerDim];
          OLMOREF_UNROLL
          for (int v = 0; v < kAttPerDim; ++v) kd[v] = sh.b[c][l + 32 * v];
          OLMOREF_UNROLL
          for (int u = 0; u < kAttPer; ++u) {
            const int row = w + kAttWarps * u;
            if (row >= at.n || !attention_in_band(a, at.b, at.i0 + row, k0 + c)) continue;
            const float ds = sh.ds[row][c];
            OLMOREF_UNROLL
            for (int v = 0; v < kAttPerDim; ++v) r.x[u][v] = hd_fma(ds, kd[v], r.x[u][v]);
          }
        }
        if (chunks > 1 || end) attention_chains_store(dq, t, end && a.bf16, r.x);  // else they stay in registers
      });
    }
  }
}

// Backward (2): key tile `tile` of a query head: keys j0 .. j0 + n − 1, per (key, d) the dk and dv chains over the
// queries of each key's band, ascending, into dk_head and dv_head [B, H, T, hd].
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_key_tile(Block& blk, AttentionBackwardShared& sh, const AttentionArgs& a,
                                            int64_t tile) {
  const AttentionTile at = attention_tile_part(a, tile, a.k_begin, attention_key_end(a));
  if (at.n <= 0) return;
  const int64_t j0 = at.i0, j_end = at.i0 + at.n, hi = attention_band_hi(a, at.b, j_end - 1);
  const int64_t query_tiles = (hi - j0) / kAttTile + 1, chunks = attention_chunks(a);
  float* dk_base = a.dk_head + at.stats * a.hd;
  float* dv_base = a.dv_head + at.stats * a.hd;
  for (int64_t qt = 0; qt < query_tiles; ++qt) {
    const int64_t i0 = j0 + qt * kAttTile, i_end = hi + 1 < i0 + kAttTile ? hi + 1 : i0 + kAttTile;
    blk.phase([&](int t, auto&) {
      if (i0 + t >= i_end) return;
      const int64_t row = at.stats + i0 + t;
      sh.m[t] = a.row_max[row], sh.l[t] = a.row_sum[row], sh.D[t] = a.row_d[row];
    });
    // Pairs (query l, key w + 8u): dP (dO and V), then the scores (Q and K), then P and dS.
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        attention_stage(sh.a, at.v, at.kw, j0, j_end, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.dout, at.qw, i0, i_end, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionBackwardRegs& r) { attention_row_key_chains(sh.a, sh.b, t / 32, t % 32, dn, ch == 0, r.dp); });
    }
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        attention_stage(sh.a, at.k, at.kw, j0, j_end, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.q, at.qw, i0, i_end, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionBackwardRegs& r) {
        const int w = t / 32, l = t % 32;
        attention_row_key_chains(sh.a, sh.b, w, l, dn, ch == 0, r.score);
        if (ch + 1 < chunks) return;
        OLMOREF_UNROLL
        for (int u = 0; u < kAttPer; ++u) {
          const int key = w + kAttWarps * u;
          if (key >= at.n || i0 + l >= i_end || !attention_in_band(a, at.b, i0 + l, j0 + key)) continue;
          const ProbGrad pg = attention_prob_grad(a, r.score[u], r.dp[u], sh.m[l], sh.l[l], sh.D[l]);
          sh.p[l][key] = pg.p, sh.ds[l][key] = pg.ds;
        }
      });
    }
    // Per (key w + 8u, dim l + 32v): dk = Σ_i dS_ij·q_i and dv = Σ_i P_ij·dO_i over the tile's queries.
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int dn = attention_chunk_dims(a, ch);
      blk.phase([&](int t, auto&) {
        attention_stage(sh.a, at.q, at.qw, i0, i_end, ch * kAttChunk, dn, t);
        attention_stage(sh.b, at.dout, at.qw, i0, i_end, ch * kAttChunk, dn, t);
      });
      blk.phase([&](int t, AttentionBackwardRegs& r) {
        const int w = t / 32, l = t % 32;
        const bool resident = chunks == 1 && qt > 0, end = qt + 1 == query_tiles;
        const AttentionChunkOut dk{dk_base, a.hd, j0, at.n, ch * kAttChunk, dn}, dv{dv_base, a.hd, j0, at.n, ch * kAttChunk, dn};
        if (!resident) attention_chains_start(dk, t, qt == 0, r.x), attention_chains_start(dv, t, qt == 0, r.y);
        for (int64_t i = i0; i < i_end; ++i) {
          const int c = static_cast<int>(i - i0);
          float qd[kAttPerDim], dod[kAttPerDim];
          OLMOREF_UNROLL
          for (int v = 0; v < kAttPerDim; ++v) qd[v] = sh.a[c][l + 32 * v], dod[v] = sh.b[c][l + 32 * v];
          // attention_in_band(a, at.b, i, j0 + key), with the band's start taken once per query: keys j0 + lo ..
          // i are query i's (asked per key in 64 bits, the kernel spilled at two blocks an SM).
          const int64_t lo = attention_band_lo(a, at.b, i) - j0;
          OLMOREF_UNROLL
          for (int u = 0; u < kAttPer; ++u) {
            const int key = w + kAttWarps * u;
            if (key >= at.n || j0 + key > i || key < lo) continue;
            const float ds = sh.ds[c][key], p = sh.p[c][key];
            OLMOREF_UNROLL
            for (int v = 0; v < kAttPerDim; ++v) {
              r.x[u][v] = hd_fma(ds, qd[v], r.x[u][v]);
              r.y[u][v] = hd_fma(p, dod[v], r.y[u][v]);
            }
          }
        }
        if (chunks > 1 || end) {  // else the chains stay in registers
          attention_chains_store(dk, t, end && a.bf16, r.x);
          attention_chains_store(dv, t, end && a.bf16, r.y);
        }
      });
    }
  }
}

// Backward (3): element e of dk/dv [B·T, KV·hd] (of a key in [k_begin, k_end)): the group's query heads in ascending
// order.
OLMOREF_HD inline void attention_group_sum(const AttentionArgs& a, int64_t e) {
  const int64_t kw = a.KV * a.hd, r = e / kw, g = (e % kw) / a.hd, d = e % a.hd, b = r / a.T, t = r % a.T;
  if (t < a.k_begin || t >= attention_key_end(a)) return;
  const int64_t group = a.H / a.KV;
  float sk = 0.0f, sv = 0.0f;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t src = ((b * a.H + g * group + hh) * a.T + t) * a.hd + d;
    sk = hh == 0 ? a.dk_head[src] : sk + a.dk_head[src];
    sv = hh == 0 ? a.dv_head[src] : sv + a.dv_head[src];
  }
  a.dk[e] = a.bf16 ? round_bf16(sk) : sk;
  a.dv[e] = a.bf16 ? round_bf16(sv) : sv;
}

void attention_forward_host(const AttentionArgs& a);
void attention_backward_host(const AttentionArgs& a);
void attention_backward_device(const AttentionArgs& a);
void attention_forward_device(const AttentionArgs& a);
// The forward blocks the current device holds at once (occupancy x SMs): the executor launches no more, so all run in
// one wave. CUDA builds only.
int64_t attention_forward_resident_blocks();

// What the device makes of the three tile kernels (CUDA builds only): registers a thread and blocks an SM, for
// bench/attention_bench's rows and tests/gpu's check that the second block an SM is there.
struct AttentionDeviceFit {
  int forward_registers = 0, forward_blocks_per_sm = 0;
  int query_registers = 0, query_blocks_per_sm = 0;  // the backward's query kernel
  int key_registers = 0, key_blocks_per_sm = 0;      // and its key kernel
};
AttentionDeviceFit attention_device_fit();
// BENCH ONLY: the same kernels and bits held to one block an SM (dynamic shared memory they never touch:
// one_block_per_sm_shared_bytes), the forward's grid capped at the SMs so that it still runs in one wave: what
// bench/attention_bench measures the second block against.
void attention_forward_device_one_block_per_sm(const AttentionArgs& a);
void attention_backward_device_one_block_per_sm(const AttentionArgs& a);

}  // namespace olmoref::kernels
