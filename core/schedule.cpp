#include "core/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/mathfn.h"

namespace olmoref {

namespace {

// math.pi; Python's cos takes it as this double.
constexpr double kPi = 3.141592653589793;

// The cosine the schedule uses. "cosine" keeps olmoref's portable det::cos (bit for bit what it always wrote). OLMo-core's
// names take the C library's cos: OLMo-core's math.cos is glibc's, which is not correctly rounded (e.g. at
// x = 0x1.9ae8fb690b5c7p-4, step 40,003 of Olmo 3 7B's cosine), so only calling the same function gives its bits:
// exactly on glibc, within an ulp elsewhere. The lr is host-side, so every executor and layout still agrees.
double schedule_cos(const ScheduleConfig& s, double x) { return s.kind == "cosine" ? det::cos(x) : std::cos(x); }

bool is_kind(const std::string& k) {
  return k == "cosine" || k == "cos_with_warmup" || k == "half_cos_with_warmup" || k == "linear_with_warmup" ||
         k == "constant" || k == "constant_with_warmup" || k == "wsd" || k == "cos_with_warmup_and_linear_decay";
}
bool has_decay(const std::string& k) { return k == "wsd" || k == "cos_with_warmup_and_linear_decay"; }
bool has_t_max(const std::string& k) {
  return k == "cosine" || k == "cos_with_warmup" || k == "half_cos_with_warmup" || k == "linear_with_warmup" ||
         k == "cos_with_warmup_and_linear_decay";
}

[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw std::invalid_argument("config key 'schedule." + key + "': " + why);
}

// Python's round(float) -> int: to nearest, ties to even (nearbyint under the default rounding mode).
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// The int operands of OLMo-core's formulas become doubles exactly (counts below 2^53), so every expression below
// is the Python one operation for operation: a + ((b · c) / d) where Python writes a + b * c / d.
double dbl(int64_t x) { return static_cast<double>(x); }

double linear_warmup(double initial_lr, int64_t current, int64_t warmup, double warmup_min_lr) {
  return warmup_min_lr + (initial_lr - warmup_min_lr) * dbl(std::min(current, warmup)) / dbl(warmup);
}

double linear_decay(double initial_lr, int64_t step_from_end, int64_t decay, double decay_min_lr) {
  if (decay == 0)
    bad("decay", "resolves to 0 at this length: OLMo-core divides by it (ZeroDivisionError); set schedule.decay >= 1 "
                 "or a larger schedule.decay_fraction");
  return decay_min_lr + (initial_lr - decay_min_lr) * dbl(std::min(step_from_end, decay)) / dbl(decay);
}

int64_t resolve_warmup(const ScheduleConfig& s, int64_t t_max) {
  return s.warmup_fraction >= 0 ? py_round(dbl(t_max) * s.warmup_fraction) : s.warmup;
}

int64_t resolve_decay(const ScheduleConfig& s, int64_t t_max) {
  return s.decay >= 0 ? s.decay : py_round(dbl(t_max) * s.decay_fraction);
}

// The frame OLMo-core's CosWithWarmup, HalfCosWithWarmup and LinearWithWarmup share: t_max (schedule.t_max when
// set, else the run's), the floor eta_min = initial_lr * alpha_f, and a linear warmup (strict <) to
// warmup_peak(eta_min). During the warmup and from t_max on, `lr` is the answer; otherwise the schedule decays
// from the warmup's end, where `current` and `t_max` then count from.
struct WarmupFrame {
  bool decaying;
  double lr, eta_min;
  int64_t current, t_max;
};
template <class Peak>
WarmupFrame warmup_frame(const ScheduleConfig& s, double initial_lr, int64_t current, int64_t t_max,
                         const Peak& warmup_peak) {
  t_max = s.t_max > 0 ? s.t_max : t_max;
  const double eta_min = initial_lr * s.alpha_f;
  const int64_t warmup = resolve_warmup(s, t_max);
  if (current < warmup)
    return {false, linear_warmup(warmup_peak(eta_min), current, warmup, s.warmup_min_lr), eta_min, 0, 0};
  if (current >= t_max) return {false, eta_min, eta_min, 0, 0};
  return {true, 0.0, eta_min, current - warmup, t_max - warmup};
}

// From initial_lr at current = 0 down to eta_min at current = t_max along half a cosine period.
double cosine_decay(const ScheduleConfig& s, double initial_lr, double eta_min, int64_t current, int64_t t_max) {
  return eta_min + (initial_lr - eta_min) * (1.0 + schedule_cos(s, kPi * dbl(current) / dbl(t_max))) / 2.0;
}

// CosWithWarmup.get_lr (also the first part of CosWithWarmupAndLinearDecay).
double cos_with_warmup(const ScheduleConfig& s, double initial_lr, int64_t current, int64_t t_max) {
  const WarmupFrame f = warmup_frame(s, initial_lr, current, t_max, [&](double) { return initial_lr; });
  return f.decaying ? cosine_decay(s, initial_lr, f.eta_min, f.current, f.t_max) : f.lr;
}

}  // namespace

void validate_schedule(const ScheduleConfig& s, double peak_lr) {
  if (!is_kind(s.kind))
    bad("kind", "must be one of \"cosine\", \"cos_with_warmup\", \"half_cos_with_warmup\", \"linear_with_warmup\", "
                "\"constant\", \"constant_with_warmup\", \"wsd\", \"cos_with_warmup_and_linear_decay\" (OLMo-core's "
                "scheduler names; docs/canonical/optimizers.md)");
  if (s.units != "steps" && s.units != "tokens") bad("units", "must be \"steps\" or \"tokens\" (OLMo-core's SchedulerUnits)");
  if (s.warmup < 0) bad("warmup", "must be >= 0");
  if (s.warmup_fraction >= 0 && s.warmup != 0)
    bad("warmup_fraction", "give either schedule.warmup or schedule.warmup_fraction, not both (as OLMo-core requires)");
  // Negative: not set (the config reader refuses a negative value written in a file).
  if (std::isnan(s.warmup_fraction) || s.warmup_fraction > 1)
    bad("warmup_fraction", "must be between 0 and 1 (as OLMo-core requires)");
  if (!(s.alpha_f >= 0 && s.alpha_f <= 1)) bad("alpha_f", "must be in [0, 1]");
  if (s.t_max < 0) bad("t_max", "must be >= 0 (0 = the run's length)");
  if (s.t_max > 0 && !has_t_max(s.kind))
    bad("t_max", "schedule \"" + s.kind + "\" has no t_max in OLMo-core (it always spans the run); remove the key");
  // OLMo-core's _linear_warmup / _linear_decay assert 0 <= min_lr < initial_lr when they run.
  if (!(s.warmup_min_lr >= 0 && std::isfinite(s.warmup_min_lr))) bad("warmup_min_lr", "must be finite and >= 0");
  if (s.warmup_min_lr > 0 && !(s.warmup_min_lr < peak_lr))
    bad("warmup_min_lr", "must be below the peak learning rate (optim.lr and every group's lr), as OLMo-core asserts");
  const bool decay_set = s.decay != -1 || s.decay_fraction != 0.1 || s.decay_min_lr != 0.0;
  if (decay_set && !has_decay(s.kind))
    bad(s.decay != -1 ? "decay" : s.decay_fraction != 0.1 ? "decay_fraction" : "decay_min_lr",
        "applies to \"wsd\" and \"cos_with_warmup_and_linear_decay\" only, not \"" + s.kind + "\"");
  if (s.decay < -1) bad("decay", "must be >= 0 (or left out: decay_fraction decides)");
  if (!(s.decay_fraction >= 0 && s.decay_fraction <= 1)) bad("decay_fraction", "must be between 0 and 1 (as OLMo-core requires)");
  if (!(s.decay_min_lr >= 0 && std::isfinite(s.decay_min_lr))) bad("decay_min_lr", "must be finite and >= 0");
  if (s.decay_min_lr > 0 && !(s.decay_min_lr < peak_lr))
    bad("decay_min_lr", "must be below the peak learning rate (optim.lr and every group's lr), as OLMo-core asserts");
}

double schedule_get_lr(const ScheduleConfig& s, double initial_lr, int64_t current, int64_t t_max) {
  const std::string& k = s.kind;
  if (k == "cosine" || k == "cos_with_warmup") return cos_with_warmup(s, initial_lr, current, t_max);
  if (k == "constant") {
    // olmoref's own since the first release: OLMo-core's CosWithWarmup warmup (strict <), then the peak.
    const int64_t warmup = resolve_warmup(s, t_max);
    return current < warmup ? linear_warmup(initial_lr, current, warmup, s.warmup_min_lr) : initial_lr;
  }
  if (k == "constant_with_warmup") {
    const int64_t warmup = resolve_warmup(s, t_max);
    return current <= warmup ? linear_warmup(initial_lr, current, warmup, s.warmup_min_lr) : initial_lr;
  }
  if (k == "half_cos_with_warmup") {
    // The warmup ends halfway between eta_min and the peak; the decay is the second half of a cosine.
    const WarmupFrame f = warmup_frame(s, initial_lr, current, t_max,
                                       [&](double eta_min) { return eta_min + (initial_lr - eta_min) / 2.0; });
    return f.decaying ? cosine_decay(s, initial_lr, f.eta_min, f.current + f.t_max, 2 * f.t_max) : f.lr;
  }
  if (k == "linear_with_warmup") {
    const WarmupFrame f = warmup_frame(s, initial_lr, current, t_max, [&](double) { return initial_lr; });
    if (!f.decaying) return f.lr;
    // Python's int / int is the correctly rounded quotient: so is the IEEE division of the two exact doubles.
    return initial_lr - (initial_lr - f.eta_min) * (dbl(f.current) / dbl(f.t_max));
  }
  if (k == "wsd") {
    const int64_t warmup = resolve_warmup(s, t_max);
    if (current <= warmup) return linear_warmup(initial_lr, current, warmup, s.warmup_min_lr);
    const int64_t decay = resolve_decay(s, t_max);
    if (current >= t_max - decay) return linear_decay(initial_lr, t_max - current, decay, s.decay_min_lr);
    return initial_lr;
  }
  if (k == "cos_with_warmup_and_linear_decay") {
    // The decay length comes from the trainer's t_max, the cosine part from schedule.t_max when set (as OLMo-core).
    const int64_t decay = resolve_decay(s, t_max);
    if (current >= t_max - decay) {
      const double final_cosine_lr = cos_with_warmup(s, initial_lr, t_max - decay, t_max);
      return linear_decay(final_cosine_lr, t_max - current, decay, s.decay_min_lr);
    }
    return cos_with_warmup(s, initial_lr, current, t_max);
  }
  bad("kind", "unknown schedule \"" + k + "\"");
}

SchedulePosition schedule_position(const ScheduleConfig& s, int64_t step, int64_t total_steps, int64_t tokens_seen,
                                   int64_t tokens_per_step) {
  if (!s.token_units()) return {step, total_steps};
  return {tokens_seen, tokens_seen + std::max<int64_t>(total_steps - step, 0) * tokens_per_step};
}

double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps) {
  if (s.token_units())
    throw std::logic_error("scheduled_lr: schedule.units = \"tokens\" needs the token counts (schedule_position)");
  return schedule_get_lr(s, peak_lr, step, total_steps);
}

}  // namespace olmoref
