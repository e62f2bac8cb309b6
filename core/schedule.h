// core/schedule.h — learning-rate schedules as OLMo-core 3.0.0 computes them (olmo_core/optim/scheduler.py), in fp64
// on the host with the same operation order, so the lr of every step is OLMo-core's bit for bit
// (docs/canonical/optimizers.md; tests/core/olmo_core_optim_check.py checks every step against OLMo-core's get_lr).
#pragma once

#include <cstdint>
#include <string>

namespace olmoref {

struct ScheduleConfig {
  // OLMo-core's registered names: "cos_with_warmup" (CosWithWarmup; "cosine" is the same function),
  // "half_cos_with_warmup", "linear_with_warmup", "constant_with_warmup", "wsd",
  // "cos_with_warmup_and_linear_decay"; plus olmoref's "constant" (linear warmup to the peak, then the peak; with
  // warmup 0 it is OLMo-core's ConstantScheduler).
  std::string kind = "cosine";
  std::string units = "steps";   // "steps" (trainer.global_step) or "tokens" (global_train_tokens_seen)
  int64_t warmup = 0;            // warmup length in `units`
  double warmup_fraction = -1;   // >= 0: warmup = round(t_max · warmup_fraction) instead (Python round, half even)
  double warmup_min_lr = 0.0;    // the warmup starts here
  double alpha_f = 0.1;          // cosine / linear floor: eta_min = lr · alpha_f
  int64_t t_max = 0;             // cosine / linear length in `units` (0: the run's length, OLMo-core's t_max=None)
  int64_t decay = -1;            // wsd / ..._and_linear_decay: decay length in `units` (-1: from decay_fraction)
  double decay_fraction = 0.1;   // decay = round(t_max · decay_fraction) when decay is -1
  double decay_min_lr = 0.0;     // the linear decay ends here

  bool token_units() const { return units == "tokens"; }
};

// Throws std::invalid_argument naming the config key ("schedule.<key>") when `s` is not a schedule OLMo-core
// accepts (its __post_init__ and get_lr assertions) for a peak learning rate `peak_lr`.
void validate_schedule(const ScheduleConfig& s, double peak_lr);

// OLMo-core's Scheduler.get_lr(initial_lr, current, t_max): `current` and `t_max` in the schedule's units.
double schedule_get_lr(const ScheduleConfig& s, double initial_lr, int64_t current, int64_t t_max);

// Where optimizer step `step` (1-based) sits on the schedule, as OLMo-core's Scheduler.set_lr reads the trainer
// just before that step's update: steps: (step, total_steps); tokens: (tokens seen including this step's batch,
// those tokens plus (total_steps − step) more batches of `tokens_per_step`), i.e. trainer.max_tokens.
struct SchedulePosition {
  int64_t current = 0, t_max = 0;
};
SchedulePosition schedule_position(const ScheduleConfig& s, int64_t step, int64_t total_steps, int64_t tokens_seen,
                                   int64_t tokens_per_step);

// Step-unit schedules at the 1-based step of the update (the form golden/ uses). A token-unit schedule needs the
// token counts: this throws std::logic_error for one.
double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps);

}  // namespace olmoref
