// core/optim.h — AdamW as OLMo-core / PyTorch apply it, OLMo-core's parameter groups, global-norm clipping
// (SkipStepAdamW: core/skip_step.h; LR schedules: core/schedule.h; docs/canonical/optimizers.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/elementwise.h"
#include "core/params.h"
#include "core/schedule.h"

namespace olmoref {

class ThreadPool;

// One of OLMo-core's OptimGroupOverride: the parameters whose names match any of `params` (fnmatch wildcards, as
// OLMo-core's _expand_param_globs) form a group with these options; unset options are the optimizer's.
struct ParamGroupOverride {
  std::vector<std::string> params;
  double lr = -1;            // < 0: not set (optim.lr)
  double weight_decay = -1;  // < 0: not set (optim.weight_decay)
};

struct AdamWConfig {
  // "adamw" (torch.optim.AdamW, foreach) or "skip_step_adamw" (OLMo-core's SkipStepAdamW, foreach=True: core/skip_step.h)
  std::string kind = "adamw";
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  // OLMo-core's group_overrides. Not set: the Olmo 3 scripts' one override, embeddings.weight without weight decay
  // (what olmoref always did). Set (also to an empty list): exactly these, in this order, then the default group.
  bool group_overrides_set = false;
  std::vector<ParamGroupOverride> group_overrides;
  // SkipStepAdamW (OLMo-core's names and defaults).
  int64_t rolling_interval_length = 128;
  double sigma_factor = 6;
  bool step_increment_bugfix = true;

  bool skip_step() const { return kind == "skip_step_adamw"; }
};

// OLMo-core's param groups (OptimConfig.build_groups): one per override, in order, then the default group of every
// parameter no override matched; groups without parameters are dropped. Each group's lr is its initial_lr, which
// the schedule scales.
struct ParamGroup {
  double lr = 0, weight_decay = 0;
  std::vector<int> params;  // indices into ParamLayout::params, in layout order
};
// Throws std::invalid_argument naming 'optim.group_overrides' when a pattern matches no parameter (OLMo-core's
// strict build) or a parameter would sit in two groups.
std::vector<ParamGroup> param_groups(const AdamWConfig& cfg, const ParamLayout& layout);
// Python fnmatch.fnmatchcase on a parameter name: * ? [seq] [!seq], no escapes.
bool fnmatch_name(const std::string& pattern, const std::string& name);

// The parameter tensors' parts of the flat range [lo, hi), in order, with the group each belongs to.
struct GroupPiece {
  int64_t begin = 0, n = 0;  // begin relative to lo
  int group = 0;
};
std::vector<GroupPiece> group_pieces(const ParamLayout& layout, const std::vector<ParamGroup>& groups, int64_t lo,
                                     int64_t hi);

// One AdamW update of the whole flat vector, for optimizer step `step` (1-based, the bias-correction
// exponent), at learning rate `lr`. Per element, in fp32 (PyTorch's AdamW with foreach=True):
//   p ← p·(1 − lr·wd)                              (decoupled decay first; wd = 0 for embeddings)
//   m ← m + (1 − β1)·(g − m)                        (lerp)
//   v ← β2·v + (1 − β2)·(g·g)
//   p ← p − (lr / (1 − β1^step)) · m / (sqrt(v) / sqrt(1 − β2^step) + eps)
void adamw_step(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr, float* params,
                const float* grad, float* m, float* v, ThreadPool* pool);
// The same update on the range [lo, hi) of the flat vectors only (a data-parallel shard); the pointers
// address element lo. Elementwise, so a sharded update gives the same bits as the whole one.
// The step's fp32 scalars, formed in fp64 and rounded once (what every executor's AdamW kernel receives), and
// each tensor's decay factor.
elem::AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t step, double lr);
float adamw_decay(const AdamWConfig& cfg, const ParamInfo& p, double lr);
// A group's decay factor float(1 − lr·wd) (1 exactly for wd = 0): what adamw_decay gives a tensor of that group.
float adamw_group_decay(double lr, double weight_decay);

void adamw_step_range(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr, int64_t lo,
                      int64_t hi, float* params, const float* grad, float* m, float* v, ThreadPool* pool);
// The parameter tensors' parts of [lo, hi), in order: `begin` relative to lo, n elements, the tensor's decay.
// Every executor's AdamW walks these (a step is elementwise within a piece).
struct AdamWPiece {
  int64_t begin = 0, n = 0;
  float decay = 1.0f;
};
std::vector<AdamWPiece> adamw_pieces(const AdamWConfig& cfg, const ParamLayout& layout, int64_t lo, int64_t hi,
                                     double lr);
// elem::adamw over one piece's elements [0, n).
void adamw_elements(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
                    int64_t n, ThreadPool* pool);

// Global gradient norm over fixed chunks of the flat vector (kNormChunk floats): each chunk's Σg² in
// fp64 by the canonical row reduction, then the chunk totals added in chunk order, then sqrt.
inline constexpr int64_t kNormChunk = 1 << 16;
double grad_norm(const float* grad, int64_t n, ThreadPool* pool);
// Per-chunk Σg² (for sharded callers that own whole chunks): out[c] for chunks [c0, c1).
void grad_norm_chunks(const float* grad, int64_t n, int64_t c0, int64_t c1, double* out, ThreadPool* pool);
// clip = min(1, max_norm / (norm + 1e-6)) rounded to fp32; grads are scaled only when clip < 1.
float clip_coefficient(double norm, double max_norm);
void scale_inplace(float* x, int64_t n, float s, ThreadPool* pool);
// Elements of x [0, n) that compare equal to 0 (-0 too; NaN is not zero): Megatron's num-zeros, counted on the
// gradient after clipping. An integer sum, so no order is involved.
int64_t count_zeros(const float* x, int64_t n, ThreadPool* pool);

}  // namespace olmoref
