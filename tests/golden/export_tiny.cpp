// Writes a tiny Hugging Face checkpoint for tests/golden/check_hf_load.py (the golden-hf-load test).
// The shape is chosen to catch mapping mistakes HF would otherwise hide: head_dim (6) differs from
// d_model / n_heads, GQA (4 query heads, 2 KV heads), a sliding layer, a forced-full last layer, and a rope theta
// and eps that are not transformers' defaults. Value j of parameter p (canonical order) is p + j/2^16.
#include <cstdio>
#include <exception>
#include <vector>

#include "interop/hf_export.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    olmoref::ModelConfig cfg{.name = "hf-load-test", .vocab_size = 96, .d_model = 16, .n_layers = 3, .n_heads = 4,
                             .n_kv_heads = 2, .head_dim = 6, .ffn_hidden = 24, .rope_theta = 10000.0, .norm_eps = 1e-5f,
                             .swa_pattern = {8, -1}, .moe = {}};
    const olmoref::ParamLayout layout(cfg);
    std::vector<float> params(static_cast<size_t>(layout.total));
    for (size_t p = 0; p < layout.params.size(); ++p)
      for (int64_t j = 0; j < layout.params[p].numel; ++j)
        params[static_cast<size_t>(layout.params[p].offset + j)] =
            static_cast<float>(p) + static_cast<float>(j) / 65536.0f;
    olmoref::HfExportOptions opts;
    opts.eos_token_id = 3;
    opts.pad_token_id = 5;
    opts.max_position_embeddings = 64;
    olmoref::export_hf_checkpoint(argv[1], cfg, layout, params.data(), opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_export_tiny: %s\n", e.what());
    return 1;
  }
  return 0;
}
