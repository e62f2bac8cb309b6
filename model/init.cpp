#include "model/init.h"

#include <algorithm>
#include <cmath>

#include "core/mathfn.h"
#include "core/parallel.h"
#include "core/rng.h"

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
  init_params_range(cfg, layout, 0, layout.total, params);
}

void init_params_range(const ModelConfig& cfg, const ParamLayout& layout, int64_t lo, int64_t hi, float* out) {
  for (size_t id = 0; id < layout.params.size(); ++id) {
    const ParamInfo& p = layout.params[id];
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a >= b) continue;
    float* dst = out + (a - lo);
    const int64_t first = a - p.offset;  // element index within the tensor
    if (p.kind == ParamKind::norm) {
      for (int64_t i = 0; i < b - a; ++i) dst[i] = 1.0f;
      continue;
    }
    default_pool().parallel_for(b - a, 1 << 14, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        dst[i] = init_value(cfg.init_seed, static_cast<uint32_t>(id), static_cast<uint64_t>(first + i), cfg.init_std);
    });
  }
}

}  // namespace olmoref
