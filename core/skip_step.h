// core/skip_step.h — OLMo-core 3.0.0's SkipStepAdamW (olmo_core/optim/skip_step_optimizer.py, adamw.py, foreach=True):
// a step is skipped when this step's loss or gradient norm lies more than sigma_factor standard deviations above
// the mean of the recent ones (docs/canonical/optimizers.md).
//
// The windows hold the global cross-entropy (fp32, no z-loss: OLMo-core feeds its reduced CE loss) and the global
// gradient norm before clipping (fp32), both layout-invariant, so the decision is the same on every data-parallel
// layout. They are part of the checkpoint (train/trainer.cpp), so a resume continues them bit for bit; OLMo-core
// itself does not save them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/elementwise.h"
#include "core/optim.h"

namespace olmoref {

struct SkipStepState {
  std::vector<float> losses, grad_norms;  // oldest first; at most rolling_interval_length + 1 each
  // OLMo-core's per-parameter state["step"]: an fp32 count of the steps taken (not skipped; all parameters agree).
  float step = 0.0f;

  nlohmann::json to_json() const;                     // exact fp32 bit patterns (hex)
  static SkipStepState from_json(const nlohmann::json& j);  // throws std::runtime_error naming the key
  bool operator==(const SkipStepState&) const = default;
};

// torch.std_mean of fp32 values on the CPU: Welford in fp64 (count as an integer), unbiased (n − 1), each result
// rounded to fp32. n = 1 gives std NaN, as torch (0/0).
struct StdMean {
  float std = 0, mean = 0;
};
StdMean torch_std_mean(const float* x, int64_t n);

// Appends this step's loss and gradient norm (the latest_loss / latest_grad_norm setters) and returns the step
// factor: 1 to step, 0 to skip (SkipStepOptimizer.get_step_factor). A NaN loss or norm compares false: skipped.
float skip_step_observe(const AdamWConfig& cfg, SkipStepState& st, float loss, float grad_norm);

// The fp32 scalars of the update of one group at learning rate lr (its scheduled lr) and weight decay wd, for the
// step factor sf, with the state's step count before this step.
elem::SkipStepScalars skip_step_scalars(const AdamWConfig& cfg, double lr, double weight_decay, float step, float sf);

// The step count after a step with factor sf (state["step"] += sf; never moves without step_increment_bugfix).
float skip_step_next_count(const AdamWConfig& cfg, float step, float sf);

// elem::skip_step_adamw over [0, n).
void skip_step_elements(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v, int64_t n,
                        ThreadPool* pool);

// The fp32 power b^k for an integer-valued fp32 k >= 0, correctly rounded (fp64 binary exponentiation of the fp32
// base, rounded once). OLMo-core's torch.pow(beta, step + 1) runs libm's or SLEEF's powf, which is not correctly
// rounded (and differs between the vector body and the scalar tail of one call): the one deliberate difference.
float pow_f32(float base, float k);

}  // namespace olmoref
