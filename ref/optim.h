// ref/optim.h — AdamW as OLMo-core / PyTorch apply it, global-norm clipping, LR schedules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/elementwise.h"
#include "ref/params.h"

namespace olmoref {

class ThreadPool;

struct AdamWConfig {
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
};

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

// Learning-rate schedules, evaluated in fp64 at the 1-based global step of the update (OLMo-core sets
// the LR from trainer.global_step before each optimizer step).
struct ScheduleConfig {
  std::string kind = "cosine";  // "cosine" (CosWithWarmup) or "constant"
  int64_t warmup = 0;           // linear warmup from 0 over this many steps
  double alpha_f = 0.1;         // cosine floor: lr_min = lr · alpha_f
  int64_t t_max = 0;            // cosine length in steps (0 = the run's total steps)
};
double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps);

}  // namespace olmoref
