// tests/common/split_reductions.h — every reduction over an instance's positions, split in runs: the chain goes on
// from run to run (the op's accumulate), as context parallelism's ranks continue it in position order, and must give
// the bits of one call over all the rows. The weight gradient's chain over rows (matmul_backward_weight), the
// RMSNorm weight's (rmsnorm_backward, and after RoPE's backward, rope_rmsnorm_backward) and the embedding's adds in
// position order (embedding_backward), on any executor: the CPU reference's paths (tests/ref/test_fused.cpp), the
// kernels' host execution (tests/kernels/test_executor.cpp) and the device (tests/gpu/test_gpu_kernels.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/executor.h"
#include "ref/ops.h"

namespace olmoref::testing {

// Runs of rows [cuts[i], cuts[i+1]): an empty run, a run of one row, a long one and the rest.
inline std::vector<int64_t> split_cuts(int64_t R) { return {0, 0, 1, R / 2, R / 2, R - 3, R}; }

// run(a, b, accumulate) reduces rows [a, b) into its output (continuing it when accumulate) and returns the output
// (host copy): true when the runs of split_cuts, each continuing the last, give one call's bits.
template <class Run>
bool split_matches_whole(int64_t R, const Run& run) {
  const std::vector<float> whole = run(0, R, false);
  std::vector<float> split;
  const std::vector<int64_t> cuts = split_cuts(R);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) split = run(cuts[i], cuts[i + 1], i > 0);
  return split.size() == whole.size() && std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)) == 0;
}

// What differs (empty when every reduction split in runs has the whole call's bits).
inline std::vector<std::string> split_reduction_mismatches(Executor& e) {
  std::vector<std::string> bad;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto normals = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng);
    return v;
  };
  const int64_t R = 77, n = 48, N = 20, K = 36, V = 13, n_heads = 3, hd = 16;
  // RMSNorm (and QK-norm after RoPE's backward: n_heads·hd columns).
  for (const bool rope : {false, true}) {
    const int64_t w_n = rope ? n_heads * hd : n;
    const std::vector<float> x = normals(R * w_n), w = normals(w_n), dy0 = normals(R * w_n);
    const RopeTable t = make_rope_table(R, hd, 500000.0);
    Buffer<float> bx(e, R * w_n, "x"), bw(e, w_n, "w"), by(e, R * w_n, "y"), bir(e, R, "inv_rms");
    Buffer<float> bdy(e, R * w_n, "dy"), bdx(e, R * w_n, "dx"), bdw(e, w_n, "dw");
    Buffer<float> bcos(e, static_cast<int64_t>(t.cos.size()), "cos"), bsin(e, static_cast<int64_t>(t.sin.size()), "sin");
    Buffer<int32_t> bpos(e, R, "positions");
    bx.upload(x.data(), R * w_n);
    bw.upload(w.data(), w_n);
    bcos.upload(t.cos.data(), bcos.size());
    bsin.upload(t.sin.data(), bsin.size());
    std::vector<int32_t> positions(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) positions[static_cast<size_t>(r)] = static_cast<int32_t>(r);
    bpos.upload(positions.data(), R);
    e.rmsnorm_forward(bx.data(), bw.data(), by.data(), bir.data(), R, w_n, 1e-6f);
    const std::vector<float> nan_dx(static_cast<size_t>(R * w_n), std::numeric_limits<float>::quiet_NaN());
    // Rows [a, b) with dw continued (accumulate) or fresh.
    auto backward = [&](int64_t a, int64_t b, bool accumulate) {
      // A fresh chain (the whole call, then the split's first run) starts from NaN dx: otherwise the whole call's dx
      // would still be there, and rows that no split run writes would compare equal.
      if (!accumulate) bdx.upload(nan_dx.data(), R * w_n);
      bdy.upload(dy0.data() + a * w_n, (b - a) * w_n, a * w_n);
      if (rope) {
        // Each row at its own position in the whole, as a rank's rows sit at theirs.
        const RopeView view{R, hd, bcos.data(), bsin.data(), bpos.data() + a};
        e.rope_rmsnorm_backward(bx.data() + a * w_n, bw.data(), bir.data() + a, bdy.data() + a * w_n,
                                bdx.data() + a * w_n, bdw.data(), b - a, n_heads, view, false, accumulate);
      } else {
        e.rmsnorm_backward(bx.data() + a * w_n, bw.data(), bir.data() + a, bdy.data() + a * w_n, bdx.data() + a * w_n,
                           bdw.data(), b - a, w_n, accumulate);
      }
      std::vector<float> out(static_cast<size_t>(R * w_n + w_n));
      e.synchronize();
      bdx.download(out.data(), R * w_n);
      bdw.download(out.data() + R * w_n, w_n);
      return out;
    };
    if (!split_matches_whole(R, backward)) bad.push_back(rope ? "rope_rmsnorm_backward" : "rmsnorm_backward");
  }
  // The weight gradient dW [N, K] = dYᵀ·X over R rows.
  {
    const std::vector<float> dY = normals(R * N), X = normals(R * K);
    Buffer<float> bdY(e, R * N, "dY"), bX(e, R * K, "X"), bdW(e, N * K, "dW");
    bdY.upload(dY.data(), R * N);
    bX.upload(X.data(), R * K);
    auto run = [&](int64_t a, int64_t b, bool accumulate) {
      e.matmul_backward_weight(bdY.data() + a * N, bX.data() + a * K, bdW.data(), b - a, N, K, accumulate);
      std::vector<float> out(static_cast<size_t>(N * K));
      e.synchronize();
      bdW.download(out.data(), N * K);
      return out;
    };
    if (!split_matches_whole(R, run)) bad.push_back("matmul_backward_weight");
  }
  // The embedding: tokens repeated across runs, absent from some, and rows holding -0 (+0 + -0 is +0: a run that
  // starts a token's sum must start it from +0, as the whole does).
  {
    std::vector<uint32_t> tokens(static_cast<size_t>(R));
    for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % (V - 2));  // tokens V-2, V-1: never
    std::vector<float> dx = normals(R * n);
    for (int64_t i = 0; i < R * n; i += 7) dx[static_cast<size_t>(i)] = -0.0f;
    Buffer<float> bdx(e, R * n, "dx"), btable(e, V * n, "dtable");
    bdx.upload(dx.data(), R * n);
    auto run = [&](int64_t a, int64_t b, bool accumulate) {
      e.embedding_backward(tokens.data() + a, bdx.data() + a * n, btable.data(), b - a, V, n, accumulate);
      std::vector<float> out(static_cast<size_t>(V * n));
      e.synchronize();
      btable.download(out.data(), V * n);
      return out;
    };
    if (!split_matches_whole(R, run)) bad.push_back("embedding_backward");
  }
  return bad;
}

}  // namespace olmoref::testing
