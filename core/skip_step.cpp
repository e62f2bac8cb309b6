#include "core/skip_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/hex.h"
#include "core/parallel.h"

namespace olmoref {

namespace {

float hex_f32(const std::string& h, const char* key) {
  if (h.size() != 8 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error(std::string("optimizer_state.") + key + ": '" + h + "' is not 8 lowercase hex digits (fp32 bits)");
  const uint32_t u = static_cast<uint32_t>(std::stoul(h, nullptr, 16));
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void trim(std::vector<float>& w, int64_t keep) {
  // list.pop(0) until len <= rolling_interval_length + 1
  if (static_cast<int64_t>(w.size()) > keep) w.erase(w.begin(), w.end() - keep);
}

// (latest − mean) <= sigma · std, each operation an fp32 tensor op as OLMo-core writes it.
bool within(const std::vector<float>& w, float sigma) {
  const StdMean sm = torch_std_mean(w.data(), static_cast<int64_t>(w.size()) - 1);
  const float diff = w.back() - sm.mean;
  const float bound = sigma * sm.std;
  return diff <= bound;
}

}  // namespace

nlohmann::json SkipStepState::to_json() const {
  nlohmann::json l = nlohmann::json::array(), g = nlohmann::json::array();
  for (float x : losses) l.push_back(f32_hex(x));
  for (float x : grad_norms) g.push_back(f32_hex(x));
  return {{"kind", "skip_step_adamw"}, {"step_hex", f32_hex(step)}, {"losses_hex", l}, {"grad_norms_hex", g}};
}

SkipStepState SkipStepState::from_json(const nlohmann::json& j) {
  SkipStepState s;
  try {
    if (j.at("kind").get<std::string>() != "skip_step_adamw")
      throw std::runtime_error("optimizer_state.kind: '" + j.at("kind").get<std::string>() + "', expected 'skip_step_adamw'");
    s.step = hex_f32(j.at("step_hex").get<std::string>(), "step_hex");
    for (const auto& x : j.at("losses_hex")) s.losses.push_back(hex_f32(x.get<std::string>(), "losses_hex"));
    for (const auto& x : j.at("grad_norms_hex")) s.grad_norms.push_back(hex_f32(x.get<std::string>(), "grad_norms_hex"));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("optimizer_state: ") + e.what());
  }
  return s;
}

StdMean torch_std_mean(const float* x, int64_t n) {
  // WelfordOps<float, double, int64_t>::reduce, then project with correction 1.
  double mean = 0.0, m2 = 0.0, nf = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    nf = static_cast<double>(i + 1);
    const double xi = static_cast<double>(x[i]);
    const double delta = xi - mean;
    mean = mean + delta / nf;
    const double new_delta = xi - mean;
    m2 = m2 + delta * new_delta;
  }
  const double divisor = nf > 1.0 ? nf - 1.0 : 0.0;
  const double var = m2 / divisor;
  return {static_cast<float>(std::sqrt(var)), static_cast<float>(mean)};
}

float skip_step_observe(const AdamWConfig& cfg, SkipStepState& st, float loss, float grad_norm) {
  const int64_t keep = cfg.rolling_interval_length + 1;
  st.losses.push_back(loss);
  trim(st.losses, keep);
  st.grad_norms.push_back(grad_norm);
  trim(st.grad_norms, keep);
  if (static_cast<int64_t>(st.losses.size()) < std::max<int64_t>(2, cfg.rolling_interval_length / 2)) return 1.0f;
  // sigma_factor is a Python number times an fp32 tensor: rounded to fp32 first.
  const float sigma = static_cast<float>(cfg.sigma_factor);
  return within(st.losses, sigma) && within(st.grad_norms, sigma) ? 1.0f : 0.0f;
}

float pow_f32(float base, float k) {
  double x = static_cast<double>(base), r = 1.0;
  for (uint64_t e = static_cast<uint64_t>(k); e > 0; e >>= 1) {
    if (e & 1) r *= x;
    x *= x;
  }
  return static_cast<float>(r);
}

elem::SkipStepScalars skip_step_scalars(const AdamWConfig& cfg, double lr, double weight_decay, float step, float sf) {
  // Python floats meet fp32 tensors: each Python expression is formed in fp64, then the tensor op rounds it to fp32.
  elem::SkipStepScalars s;
  const float lr_wd = static_cast<float>(lr * weight_decay);
  s.decay = 1.0f - sf * lr_wd;
  s.w1 = sf * static_cast<float>(1.0 - cfg.beta1);
  s.c1 = 1.0f - s.w1;
  s.w2 = sf * static_cast<float>(1.0 - cfg.beta2);
  s.c2 = 1.0f - s.w2;
  const float next = step + 1.0f;
  const float bc1 = 1.0f - pow_f32(static_cast<float>(cfg.beta1), next);
  const float bc2 = 1.0f - pow_f32(static_cast<float>(cfg.beta2), next);
  // lr / tensor is Tensor.__rtruediv__: reciprocal, then times lr.
  const float step_size = (1.0f / bc1) * static_cast<float>(lr);
  s.bc2_sqrt = std::sqrt(bc2);
  s.eps = static_cast<float>(cfg.eps);
  s.neg_step_size = -sf * step_size;
  return s;
}

float skip_step_next_count(const AdamWConfig& cfg, float step, float sf) {
  return cfg.step_increment_bugfix ? step + sf : step;
}

void skip_step_elements(const elem::SkipStepScalars& s, const float* grad, float* p, float* m, float* v, int64_t n,
                        ThreadPool* pool) {
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) elem::skip_step_adamw(s, grad[i], p[i], m[i], v[i]);
  };
  if (pool) pool->parallel_for(n, 1 << 14, body); else body(0, n);
}

}  // namespace olmoref
