// tests/common/test_models.h — small models more than one test program trains or differentiates.
//
// Tests write their models as ModelConfig designated initializers that end in `.moe = {}` (a dense model): GCC's
// -Wmissing-field-initializers asks for the last member, which has no default member initializer.
#pragma once

#include <string>

#include "core/model_config.h"

namespace olmoref::testing {

// The gradient checks' model (tests/model/test_gradcheck.cpp in fp32, test_bf16.cpp in bf16): GQA 2:1, a window
// of 3 < T = 10 on every layer but the last, and init_std 0.3, large enough that every nonlinearity matters.
inline ModelConfig gradcheck_model(const std::string& name) {
  return ModelConfig{.name = name, .vocab_size = 32, .d_model = 16, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                     .head_dim = 4, .ffn_hidden = 24, .rope_theta = 10000.0, .swa_pattern = {3, 3, 3, -1},
                     .init_std = 0.3, .init_seed = 11, .moe = {}};
}

}  // namespace olmoref::testing
