// tests/core/optim_dump.cpp — what olmoref's schedule and param groups make of a config, for OLMo-core's own code
// to be compared with (tests/core/olmo_core_optim_check.py). The same functions the trainer calls.
//
//   optim_dump schedule CONFIG [section.key=value ...]   one JSON line per step: current, t_max, lr (fp64 hex)
//   optim_dump groups CONFIG [section.key=value ...]     one JSON line per param group: lr, weight_decay, names
//   optim_dump params CONFIG                             every parameter's name and shape, in layout order
//   optim_dump replay CONFIG DIR [section.key=value ...] SkipStepAdamW (or AdamW) driven by DIR/params0.f32,
//        DIR/grads.f32 (one flat gradient per step) and DIR/inputs.jsonl (ce_hex, grad_norm_hex per step) through
//        the trainer's functions; appends DIR/out/params.f32 and DIR/out/steps.jsonl as the trainer's
//        OLMOREF_TEST_OPTIM_DUMP does
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/hex.h"
#include "core/optim.h"
#include "core/skip_step.h"
#include "core/params.h"
#include "train/config.h"

using namespace olmoref;

namespace {
std::string hex64(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(u));
  return b;
}
float from_hex32(const std::string& h) {
  const uint32_t u = static_cast<uint32_t>(std::stoul(h, nullptr, 16));
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// The trainer's optimizer part of train_step (train/trainer.cpp), on host vectors, one process.
int replay(const TrainConfig& cfg, const std::string& dir) {
  const ParamLayout layout(cfg.model);
  const int64_t n = layout.total;
  std::vector<float> p = read_f32(dir + "/params0.f32"), grads = read_f32(dir + "/grads.f32");
  if (static_cast<int64_t>(p.size()) != n) throw std::runtime_error(dir + "/params0.f32: not " + std::to_string(n) + " floats");
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  const std::vector<ParamGroup> groups = param_groups(cfg.optim, layout);
  const std::vector<GroupPiece> pieces = group_pieces(layout, groups, 0, n);
  std::filesystem::create_directories(dir + "/out");
  std::ofstream params_out(dir + "/out/params.f32", std::ios::binary);
  std::ofstream steps_out(dir + "/out/steps.jsonl");
  std::ifstream inputs(dir + "/inputs.jsonl");
  SkipStepState st;
  const int64_t tps = cfg.train.global_batch_instances * cfg.train.seq_len;
  std::string line;
  for (int64_t step = 1; std::getline(inputs, line); ++step) {
    const nlohmann::json in = nlohmann::json::parse(line);
    const float ce = from_hex32(in.at("ce_hex")), norm = from_hex32(in.at("grad_norm_hex"));
    if (static_cast<int64_t>(grads.size()) < step * n) throw std::runtime_error(dir + "/grads.f32: too short");
    const float* g = grads.data() + (step - 1) * n;
    const SchedulePosition pos = schedule_position(cfg.schedule, step, cfg.train.steps, step * tps, tps);
    std::vector<double> group_lr;
    for (const ParamGroup& grp : groups) group_lr.push_back(schedule_get_lr(cfg.schedule, grp.lr, pos.current, pos.t_max));
    int skipped = -1;
    if (cfg.optim.skip_step()) {
      const float sf = skip_step_observe(cfg.optim, st, ce, norm);
      std::vector<elem::SkipStepScalars> sc;
      for (size_t k = 0; k < groups.size(); ++k)
        sc.push_back(skip_step_scalars(cfg.optim, group_lr[k], groups[k].weight_decay, st.step, sf));
      for (const GroupPiece& q : pieces)
        skip_step_elements(sc[q.group], g + q.begin, p.data() + q.begin, m.data() + q.begin, v.data() + q.begin, q.n, nullptr);
      st.step = skip_step_next_count(cfg.optim, st.step, sf);
      skipped = sf == 0.0f ? 1 : 0;
    } else {
      for (const GroupPiece& q : pieces)
        adamw_elements(adamw_scalars(cfg.optim, step, group_lr[q.group]),
                       adamw_group_decay(group_lr[q.group], groups[q.group].weight_decay), g + q.begin,
                       p.data() + q.begin, m.data() + q.begin, v.data() + q.begin, q.n, nullptr);
    }
    params_out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(n * 4));
    nlohmann::json rec = {{"step", step}, {"ce_hex", f32_hex(ce)}, {"grad_norm_hex", f32_hex(norm)}, {"skipped", skipped},
                          {"current", pos.current}, {"t_max", pos.t_max}, {"skip_step_count_hex", f32_hex(st.step)}};
    for (double x : group_lr) rec["group_lr_hex"].push_back(hex64(x));
    steps_out << rec.dump() << "\n";
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: optim_dump schedule|groups|params CONFIG [section.key=value ...]\n");
    return 2;
  }
  const std::string what = argv[1];
  const int first_override = what == "replay" ? 4 : 3;
  if (argc < first_override) {
    std::fprintf(stderr, "usage: optim_dump replay CONFIG DIR [section.key=value ...]\n");
    return 2;
  }
  std::vector<std::string> overrides(argv + first_override, argv + argc);
  try {
    const TrainConfig cfg = load_config(argv[2], overrides);
    if (what == "replay") return replay(cfg, argv[3]);
    if (what == "schedule") {
      const int64_t tps = cfg.train.global_batch_instances * cfg.train.seq_len;
      for (int64_t step = 1; step <= cfg.train.steps; ++step) {
        const SchedulePosition pos = schedule_position(cfg.schedule, step, cfg.train.steps, step * tps, tps);
        const double lr = schedule_get_lr(cfg.schedule, cfg.optim.lr, pos.current, pos.t_max);
        std::cout << nlohmann::json{{"step", step}, {"current", pos.current}, {"t_max", pos.t_max}, {"lr_hex", hex64(lr)}}.dump()
                  << "\n";
      }
    } else if (what == "groups" || what == "params") {
      const ParamLayout layout(cfg.model);
      if (what == "params") {
        for (const ParamInfo& p : layout.params) std::cout << nlohmann::json{{"name", p.name}, {"shape", p.shape}}.dump() << "\n";
        return 0;
      }
      for (const ParamGroup& g : param_groups(cfg.optim, layout)) {
        nlohmann::json names = nlohmann::json::array();
        for (int i : g.params) names.push_back(layout.params[static_cast<size_t>(i)].name);
        std::cout << nlohmann::json{{"lr_hex", hex64(g.lr)}, {"weight_decay_hex", hex64(g.weight_decay)}, {"params", names}}.dump()
                  << "\n";
      }
    } else {
      std::fprintf(stderr, "optim_dump: unknown command '%s'\n", what.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}
