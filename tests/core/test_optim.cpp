// OLMo-core's optimizers and schedulers in olmoref (docs/canonical/optimizers.md): the parts that need no OLMo-core.
// Bit-for-bit agreement with OLMo-core's own code is tests/core/olmo_core_optim_check.py.
#include <doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/optim.h"
#include "core/params.h"
#include "core/schedule.h"
#include "core/skip_step.h"
#include "train/config.h"

using namespace olmoref;

namespace {

const char* kBase = R"(
[model]
vocab_size = 64
d_model = 16
n_layers = 2
n_heads = 2
ffn_hidden = 32
swa_pattern = [-1]
[train]
seq_len = 8
global_batch_instances = 2
steps = 100
[optim]
lr = 1e-3
)";

TrainConfig cfg_with(std::vector<std::string> overrides) { return parse_config_text(kBase, "t.toml", overrides); }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace

TEST_CASE("existing configs write no new key: their TOML, resume hash and traces are what they were") {
  const TrainConfig c = cfg_with({});
  const std::string t = c.to_toml();
  for (std::string key : {"kind = \"adamw\"", "rolling_interval_length", "sigma_factor", "step_increment_bugfix",
                          "group_overrides", "\nunits", "warmup_fraction", "warmup_min_lr", "\ndecay"})
    CHECK_MESSAGE(t.find(key) == std::string::npos, key);
  // A schedule key at its default, written explicitly, changes nothing either.
  CHECK(cfg_with({"schedule.units=\"steps\"", "schedule.decay_fraction=0.1", "optim.kind=\"adamw\""}).resume_hash() ==
        c.resume_hash());
  CHECK(cfg_with({"optim.kind=\"skip_step_adamw\""}).resume_hash() != c.resume_hash());
}

TEST_CASE("new keys round-trip through to_toml") {
  const TrainConfig a = cfg_with({"optim.kind=\"skip_step_adamw\"", "optim.rolling_interval_length=16", "optim.sigma_factor=2.5",
                                  "optim.group_overrides=[{params=[\"embeddings.weight\", \"*norm*\"], opts={weight_decay=0.0}},"
                                  " {params=\"lm_head.w_out.weight\", opts={lr=2e-3}}]",
                                  "schedule.kind=\"wsd\"", "schedule.units=\"tokens\"", "schedule.warmup_fraction=0.05",
                                  "schedule.decay=64", "schedule.decay_min_lr=1e-5", "schedule.warmup_min_lr=1e-6"});
  const TrainConfig b = parse_config_text(a.to_toml(), "resolved.toml");
  CHECK(b.to_toml() == a.to_toml());
  CHECK(b.optim.skip_step());
  CHECK(b.optim.rolling_interval_length == 16);
  CHECK(b.optim.sigma_factor == 2.5);
  REQUIRE(b.optim.group_overrides.size() == 2);
  CHECK(b.optim.group_overrides[1].lr == 2e-3);
  CHECK(b.schedule.decay == 64);
  CHECK(b.schedule.warmup_fraction == 0.05);
  CHECK(b.schedule.units == "tokens");
}

TEST_CASE("config errors name the key and the fix") {
  auto err = [](std::vector<std::string> ov) {
    try {
      cfg_with(std::move(ov));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err({"optim.kind=\"lion\""}).find("optim.kind") != std::string::npos);
  CHECK(err({"optim.sigma_factor=3"}).find("applies to optim.kind = \"skip_step_adamw\" only") != std::string::npos);
  CHECK(err({"schedule.kind=\"cosine_annealing\""}).find("schedule.kind") != std::string::npos);
  CHECK(err({"schedule.warmup=5", "schedule.warmup_fraction=0.1"}).find("not both") != std::string::npos);
  CHECK(err({"schedule.kind=\"wsd\"", "schedule.decay=5", "schedule.decay_fraction=0.2"}).find("not both") != std::string::npos);
  CHECK(err({"schedule.decay=5"}).find("applies to \"wsd\"") != std::string::npos);
  CHECK(err({"schedule.kind=\"wsd\"", "schedule.t_max=50"}).find("has no t_max") != std::string::npos);
  CHECK(err({"schedule.units=\"epochs\""}).find("schedule.units") != std::string::npos);
  CHECK(err({"schedule.warmup_min_lr=1e-2"}).find("below the peak") != std::string::npos);
  CHECK(err({"optim.group_overrides=[{params=[\"embedding.weight\"], opts={weight_decay=0.0}}]"})
            .find("'embedding.weight' does not match any parameter") != std::string::npos);
  CHECK(err({"optim.group_overrides=[{params=[\"*norm*\"], opts={weight_decay=0.0}}, {params=[\"lm_head.*\"], opts={}}]"})
            .find("lm_head.norm.weight' is matched by group 0 and group 1") != std::string::npos);
  CHECK(err({"optim.group_overrides=[{params=[\"*\"], opts={betas=0.9}}]"}).find("option 'betas' is not supported") !=
        std::string::npos);
}

TEST_CASE("param groups: OLMo-core's order, the Olmo 3 default, fnmatch") {
  const TrainConfig d = cfg_with({});
  const ParamLayout L(d.model);
  const auto def = param_groups(d.optim, L);
  REQUIRE(def.size() == 2);  // the embeddings override, then everything else
  CHECK(def[0].params == std::vector<int>{0});
  CHECK(def[0].weight_decay == 0.0);
  CHECK(def[1].weight_decay == 0.1);
  CHECK(def[1].params.size() == L.params.size() - 1);
  // An empty list: OLMo-core's no overrides, one group that decays everything.
  const auto none = param_groups(cfg_with({"optim.group_overrides=[]"}).optim, L);
  REQUIRE(none.size() == 1);
  CHECK(none[0].params.size() == L.params.size());
  // Norms without decay at their own lr: pattern by pattern, each pattern's matches in model order.
  const auto g = param_groups(
      cfg_with({"optim.group_overrides=[{params=[\"lm_head.norm.weight\", \"blocks.*_norm.weight\"], opts={weight_decay=0.0, lr=5e-4}}]"})
          .optim,
      L);
  REQUIRE(g.size() == 2);
  CHECK(g[0].lr == 5e-4);
  CHECK(L.params[static_cast<size_t>(g[0].params[0])].name == "lm_head.norm.weight");
  for (int i : g[0].params) CHECK(L.params[static_cast<size_t>(i)].kind == ParamKind::norm);
  CHECK(g[0].params.size() == 1 + 2 * 4);  // final norm; q_norm, k_norm, attention_norm, feed_forward_norm per block
  CHECK(fnmatch_name("blocks.?.attention.w_[qk].weight", "blocks.1.attention.w_k.weight"));
  CHECK(!fnmatch_name("blocks.?.attention.w_[!qk].weight", "blocks.1.attention.w_k.weight"));
  CHECK(fnmatch_name("[x", "[x"));  // an unclosed set is a literal, as Python
  CHECK(!fnmatch_name("blocks.*", "embeddings.weight"));
}

TEST_CASE("schedules: the existing kinds keep their values; OLMo-core's boundaries") {
  ScheduleConfig s;
  s.warmup = 10;
  s.alpha_f = 0.1;
  CHECK(schedule_get_lr(s, 1.0, 5, 110) == 0.5);
  CHECK(schedule_get_lr(s, 1.0, 110, 110) == 0.1 * 1.0);
  ScheduleConfig w;
  w.kind = "wsd";
  w.warmup = 10;
  w.decay = 20;
  CHECK(schedule_get_lr(w, 1.0, 10, 100) == 1.0);   // current <= warmup: still the warmup formula (= peak)
  CHECK(schedule_get_lr(w, 1.0, 80, 100) == 1.0);   // t_max - decay: the decay starts at the peak
  CHECK(schedule_get_lr(w, 1.0, 90, 100) == 0.5);
  CHECK(schedule_get_lr(w, 1.0, 100, 100) == 0.0);
  w.decay = -1;
  w.decay_fraction = 0.001;  // round(100 · 0.001) = 0: OLMo-core divides by zero at the last step
  CHECK_THROWS_WITH_AS(schedule_get_lr(w, 1.0, 100, 100), doctest::Contains("schedule.decay"), std::invalid_argument);
  ScheduleConfig f;
  f.warmup_fraction = 0.025;  // round(100 · 0.025) = round(2.5) = 2 (half to even, as Python)
  CHECK(schedule_get_lr(f, 1.0, 1, 100) == 0.5);
  ScheduleConfig tok;
  tok.units = "tokens";
  const SchedulePosition p = schedule_position(tok, 3, 10, 3 * 512, 512);
  CHECK(p.current == 1536);
  CHECK(p.t_max == 5120);
  CHECK_THROWS_AS(scheduled_lr(tok, 1.0, 3, 10), std::logic_error);
}

TEST_CASE("torch.std_mean: Welford in fp64, unbiased, rounded to fp32") {
  const float x[] = {1.0f, 2.0f, 4.0f};
  const StdMean sm = torch_std_mean(x, 3);
  CHECK(sm.mean == static_cast<float>(7.0 / 3.0));
  CHECK(sm.std == static_cast<float>(std::sqrt(((1 - 7.0 / 3) * (1 - 7.0 / 3) + (2 - 7.0 / 3) * (2 - 7.0 / 3) +
                                                 (4 - 7.0 / 3) * (4 - 7.0 / 3)) / 2.0)));
  CHECK(std::isnan(torch_std_mean(x, 1).std));  // one value: 0/0, as torch
}

TEST_CASE("skip decisions: warm-up, spikes, NaN") {
  AdamWConfig c;
  c.kind = "skip_step_adamw";
  c.rolling_interval_length = 8;  // decisions from the 4th value on (max(2, 8 // 2)), windows of up to 9
  c.sigma_factor = 6;
  SkipStepState st;
  const float losses[] = {3.0f, 3.1f, 2.9f, 3.05f, 2.95f, 3.0f};
  for (int i = 0; i < 3; ++i) CHECK(skip_step_observe(c, st, losses[i], 1.0f + 0.01f * static_cast<float>(i)) == 1.0f);
  for (int i = 3; i < 6; ++i) CHECK(skip_step_observe(c, st, losses[i], 1.0f + 0.01f * static_cast<float>(i % 3)) == 1.0f);
  CHECK(skip_step_observe(c, st, 9.0f, 1.0f) == 0.0f);   // a loss spike
  CHECK(skip_step_observe(c, st, 3.0f, 50.0f) == 0.0f);  // a gradient-norm spike
  CHECK(skip_step_observe(c, st, std::numeric_limits<float>::quiet_NaN(), 1.0f) == 0.0f);
  CHECK(st.losses.size() == 9);  // the spikes stay in the windows, as in OLMo-core
  CHECK(st.grad_norms.size() == 9);
  // Lower in loss or norm is never a spike.
  SkipStepState low = st;
  low.losses.assign(8, 3.0f);
  low.losses[1] = 3.5f;
  low.grad_norms.assign(8, 1.0f);
  low.grad_norms[1] = 1.5f;
  CHECK(skip_step_observe(c, low, 0.1f, 0.01f) == 1.0f);
}

TEST_CASE("a skipped step leaves params and moments as they were; the step count waits") {
  AdamWConfig c;
  c.kind = "skip_step_adamw";
  const elem::SkipStepScalars skip = skip_step_scalars(c, 1e-3, 0.1, 4.0f, 0.0f);
  const float g[] = {0.5f, -2.0f, 1e-3f};
  float p[] = {0.25f, -1.5f, 3.0f}, m[] = {0.1f, -0.2f, 0.0f}, v[] = {0.01f, 0.04f, 1e-6f};
  float p0[3], m0[3], v0[3];
  std::memcpy(p0, p, sizeof p), std::memcpy(m0, m, sizeof m), std::memcpy(v0, v, sizeof v);
  skip_step_elements(skip, g, p, m, v, 3, nullptr);
  for (int i = 0; i < 3; ++i) {
    CHECK(same_bits(p[i], p0[i]));
    CHECK(same_bits(m[i], m0[i]));
    CHECK(same_bits(v[i], v0[i]));
  }
  CHECK(skip_step_next_count(c, 4.0f, 0.0f) == 4.0f);
  CHECK(skip_step_next_count(c, 4.0f, 1.0f) == 5.0f);
  c.step_increment_bugfix = false;
  CHECK(skip_step_next_count(c, 4.0f, 1.0f) == 4.0f);
  // A taken step moves them, with the bias correction of the step count (not the global step).
  AdamWConfig d;
  d.kind = "skip_step_adamw";
  const elem::SkipStepScalars s0 = skip_step_scalars(d, 1e-3, 0.1, 0.0f, 1.0f);
  CHECK(s0.c1 == 1.0f - static_cast<float>(1.0 - d.beta1));
  CHECK(s0.neg_step_size == -((1.0f / (1.0f - static_cast<float>(d.beta1))) * static_cast<float>(1e-3)));
  skip_step_elements(s0, g, p, m, v, 3, nullptr);
  CHECK(!same_bits(p[0], p0[0]));
}

TEST_CASE("correctly rounded fp32 powers") {
  CHECK(pow_f32(0.5f, 3.0f) == 0.125f);
  CHECK(pow_f32(0.9f, 0.0f) == 1.0f);
  CHECK(pow_f32(static_cast<float>(0.95), 58.0f) == static_cast<float>(std::pow(static_cast<double>(0.95f), 58.0)));
}

TEST_CASE("the windows survive a checkpoint bit for bit") {
  SkipStepState s;
  s.losses = {3.0f, std::numeric_limits<float>::quiet_NaN(), -0.0f, 1e-30f};
  s.grad_norms = {1.0f, std::numeric_limits<float>::infinity()};
  s.step = 17.0f;
  const SkipStepState r = SkipStepState::from_json(nlohmann::json::parse(s.to_json().dump()));
  REQUIRE(r.losses.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(same_bits(r.losses[i], s.losses[i]));
  CHECK(same_bits(r.grad_norms[1], s.grad_norms[1]));
  CHECK(r.step == 17.0f);
  nlohmann::json bad = s.to_json();
  bad["losses_hex"][0] = "3f8";
  CHECK_THROWS_WITH_AS(SkipStepState::from_json(bad), doctest::Contains("losses_hex"), std::runtime_error);
}
