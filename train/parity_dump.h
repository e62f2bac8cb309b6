// train/parity_dump.h — `olmoref parity-dump`: everything golden/parity/hf_parity.py needs to compare
// this implementation with Hugging Face's Olmo3ForCausalLM (docs/parity.md describes the bundle).
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"

namespace olmoref {

void write_parity_bundle(const TrainConfig& cfg, const std::string& out_dir, int64_t steps, int threads);

}  // namespace olmoref
