// train/parity_dump.h — `olmoref parity-dump`: everything golden/parity/hf_parity.py needs to compare
// this implementation with Hugging Face's Olmo3ForCausalLM, or, for a mixture-of-experts config, what
// golden/parity/olmo_core_moe_parity.py needs to compare it with OLMo-core's MoETransformer
// (golden/parity/README.md describes both bundles).
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"

namespace olmoref {

void write_parity_bundle(const TrainConfig& cfg, const std::string& out_dir, int64_t steps, int threads);

}  // namespace olmoref
