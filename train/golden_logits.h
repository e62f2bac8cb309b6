// train/golden_logits.h — a logits bundle: our logits for long real-text sequences at given weights and precision,
// with those weights as a Hugging Face checkpoint, for golden/parity/hf_parity.py --logits (the bf16 parity).
//
//   DIR/hf/                    the weights (fp32 master weights) as an Olmo3ForCausalLM checkpoint
//   DIR/tokens.u32             [N, T] token ids, little-endian uint32: N consecutive T-token windows from the start
//                              of the first file of the chosen data mix (real text, documents joined by EOS)
//   DIR/ours_logits.safetensors  "logits": F32 [N, T, V], every position (bf16-valued in bf16 precision)
//   DIR/ours.json              precision, shape, loss/ce/z over the windows, where the weights came from
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref {

struct LogitsBundleOptions {
  std::string config_path;             // step-0 weights of this config, or
  std::string checkpoint;              // the weights of this checkpoint (its own config)
  std::vector<std::string> overrides;  // applied to the config (either source)
  std::string precision;               // fp32 | bf16; empty: the config's
  int64_t seq_len = 0;                 // T (required)
  int64_t instances = 1;               // N
  std::string data = "auto";           // holdout | train | auto (holdout when the config has one)
  std::string out_dir;
  int threads = 0;
};

struct LogitsBundleSummary {
  double loss = 0, ce = 0, z = 0;
  int64_t step = 0;  // of the checkpoint (0: step-0 weights)
  std::string tokens_from;
  double seconds = 0;
};

LogitsBundleSummary write_logits_bundle(const LogitsBundleOptions& opts);

}  // namespace olmoref
