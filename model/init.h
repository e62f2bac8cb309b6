// model/init.h — Olmo 3 initialisation (spec §2): every weight matrix, embeddings and LM head included,
// ~ N(0, init_std²) truncated to ±3·init_std; every norm weight = 1. No depth or width scaling.
#pragma once

#include <cstdint>

#include "core/model_config.h"
#include "core/params.h"

namespace olmoref {

// Element `index` of parameter `param_id` (its position in ParamLayout::params): a pure function,
// so any shard of any rank can initialise its slice alone and get the full-tensor values.
float init_value(uint64_t seed, uint32_t param_id, uint64_t index, double std);

// Fills the whole flat parameter vector (layout.total floats).
void init_params(const ModelConfig& cfg, const ParamLayout& layout, float* params);
// Only [lo, hi) of the flat vector, into out (hi - lo floats): what a shard owner initialises.
void init_params_range(const ModelConfig& cfg, const ParamLayout& layout, int64_t lo, int64_t hi, float* out);

}  // namespace olmoref
