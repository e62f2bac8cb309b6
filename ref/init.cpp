#include "ref/init.h"

#include <cmath>

#include "ref/mathfn.h"
#include "ref/parallel.h"
#include "ref/rng.h"

namespace olmoref {

float init_value(uint64_t seed, uint32_t param_id, uint64_t index, double std) {
  // Box–Muller on counter-based uniforms; rejection (a new counter `attempt`) outside ±3σ keeps the
  // distribution an exact truncated normal. P(reject) = 0.27%, so attempts rarely exceed 1.
  for (uint32_t attempt = 0;; ++attempt) {
    double u1, u2;
    uniform2(seed, RngPurpose::init, param_id, index, attempt, &u1, &u2);
    const double radius = std::sqrt(-2.0 * det::log(u1));
    const double z = radius * det::cos(6.283185307179586 * u2);
    if (z >= -3.0 && z <= 3.0) return static_cast<float>(z * std);
  }
}

void init_params(const ModelConfig& cfg, const ParamLayout& layout, float* params) {
  for (size_t id = 0; id < layout.params.size(); ++id) {
    const ParamInfo& p = layout.params[id];
    float* dst = params + p.offset;
    if (p.kind == ParamKind::norm) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = 1.0f;
      continue;
    }
    default_pool().parallel_for(p.numel, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = init_value(cfg.init_seed, static_cast<uint32_t>(id), i, cfg.init_std);
    });
  }
}

}  // namespace olmoref
