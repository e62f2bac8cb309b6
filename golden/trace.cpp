#include "golden/trace.h"

#include <algorithm>
#include <bit>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/json_file.h"
#include "golden/digest.h"

namespace olmoref {

namespace {
// JSON has no NaN or infinity: a non-finite value is written as null, and its *_hex field keeps it exactly.
std::string fmt(const char* f, double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
// A decimal field without its hex twin (hand-written traces): null reads as NaN.
template <class T>
T decimal(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  return v.is_null() ? std::numeric_limits<T>::quiet_NaN() : v.get<T>();
}
// `,"KEY":decimal,"KEY_hex":"exact bits"`: 9 significant digits for a float, 17 for a double.
std::string exact_field(const char* key, float x) {
  return std::string(",\"") + key + "\":" + fmt("%.9g", x) + ",\"" + key + "_hex\":\"" +
         f32_hex(x) + "\"";
}
std::string exact_field(const char* key, double x) {
  return std::string(",\"") + key + "\":" + fmt("%.17g", x) + ",\"" + key + "_hex\":\"" +
         hex64(std::bit_cast<uint64_t>(x)) + "\"";
}
}  // namespace

// Hand-formatted so the key order and number formatting are fixed forever (the golden traces in the
// repository are compared byte for byte).
std::string TraceRecord::to_json() const {
  std::string s = "{\"step\":" + std::to_string(step) + ",\"epoch\":" + std::to_string(epoch);
  s += exact_field("loss", loss);
  s += exact_field("ce", ce);
  s += exact_field("z", z);
  s += exact_field("grad_norm", grad_norm);
  s += exact_field("clip", clip);
  s += exact_field("lr", lr);
  s += ",\"tokens\":" + std::to_string(tokens);
  if (num_zeros >= 0) s += ",\"num_zeros\":" + std::to_string(num_zeros);
  // Only an optimizer that can skip writes it, so every other trace stays byte for byte what it was.
  if (skipped >= 0) s += ",\"skipped\":" + std::to_string(skipped);
  s += ",\"data_digest\":\"" + data_digest + "\",\"param_digest\":\"" + param_digest + "\"";
  if (!routing_digest.empty()) {
    s += exact_field("moe_lb", moe_lb);
    s += exact_field("moe_z", moe_z);
    s += ",\"routing_digest\":\"" + routing_digest + "\",\"expert_load\":[";
    for (size_t l = 0; l < expert_load.size(); ++l) {
      s += l ? ",[" : "[";
      for (size_t e = 0; e < expert_load[l].size(); ++e) {
        if (e) s += ',';  // appended apart: GCC 12 warns (-Wrestrict, a false positive) on literal + to_string
        s += std::to_string(expert_load[l][e]);
      }
      s += "]";
    }
    s += "]";
    // The load at a glance, derived from expert_load (integers, so the same bits everywhere): the least and most
    // loaded expert of any layer, and the worst layer's max / mean (1 = perfectly balanced, E = one expert took all).
    int64_t lo = -1, hi = -1;
    double imbalance = 0;
    for (const auto& layer : expert_load) {
      int64_t sum = 0, top = 0;
      for (int64_t c : layer) {
        lo = lo < 0 ? c : std::min(lo, c), hi = std::max(hi, c), top = std::max(top, c), sum += c;
      }
      if (sum > 0)
        imbalance = std::max(imbalance, static_cast<double>(top) * static_cast<double>(layer.size()) /
                                            static_cast<double>(sum));
    }
    s += ",\"expert_load_min\":" + std::to_string(lo) + ",\"expert_load_max\":" + std::to_string(hi) +
         ",\"expert_imbalance\":" + fmt("%.17g", imbalance);
  }
  if (records_begin > 0) {
    s += ",\"records_begin\":";
    s += std::to_string(records_begin);
  }
  s += "}";
  return s;
}

std::string TraceRecord::to_line() const { return data::with_record_checksum(to_json()); }

TraceRecord TraceRecord::from_json(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line);  // first: a torn line is no JSON, never a checksum error
  if (const std::string why = data::record_checksum_mismatch(line); !why.empty()) throw TraceChecksumError(why);
  TraceRecord r;
  r.step = j.at("step").get<int64_t>();
  r.epoch = j.value("epoch", int64_t{0});
  auto f32 = [&](const char* hex_key, const char* dec_key) {
    if (j.contains(hex_key))
      return std::bit_cast<float>(static_cast<uint32_t>(std::stoul(j.at(hex_key).get<std::string>(), nullptr, 16)));
    return decimal<float>(j, dec_key);
  };
  r.loss = f32("loss_hex", "loss");
  r.ce = f32("ce_hex", "ce");
  r.z = f32("z_hex", "z");
  r.grad_norm = f32("grad_norm_hex", "grad_norm");
  r.clip = f32("clip_hex", "clip");
  r.lr = j.contains("lr_hex") ? std::bit_cast<double>(std::stoull(j.at("lr_hex").get<std::string>(), nullptr, 16))
                              : decimal<double>(j, "lr");
  r.tokens = j.at("tokens").get<int64_t>();
  r.num_zeros = j.value("num_zeros", int64_t{-1});  // traces written before num_zeros was recorded lack it
  r.skipped = j.value("skipped", -1);  // only optimizers that can skip write it
  r.data_digest = j.at("data_digest").get<std::string>();
  r.param_digest = j.at("param_digest").get<std::string>();
  if (j.contains("routing_digest")) {
    r.moe_lb = f32("moe_lb_hex", "moe_lb");
    r.moe_z = f32("moe_z_hex", "moe_z");
    r.routing_digest = j.at("routing_digest").get<std::string>();
    r.expert_load = j.value("expert_load", std::vector<std::vector<int64_t>>{});
  }
  r.records_begin = j.value("records_begin", int64_t{0});
  return r;
}

std::vector<TraceRecord> read_trace(const std::string& path) {
  return data::read_json_lines<TraceRecord>(
      path, path + ": cannot open trace", TraceRecord::from_json, [&](int64_t line_no, const char* why) {
        return path + ":" + std::to_string(line_no) + ": not a trace record (" + why + ")";
      });
}

void truncate_step_records(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    int64_t step = 0;
    try {
      step = nlohmann::json::parse(line).at("step").get<int64_t>();
    } catch (const std::exception&) {
      break;  // a record torn by a kill: it and everything after it go
    }
    if (step > last_step) break;
    kept += line + "\n";
  }
  in.close();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    if (!out) throw std::runtime_error(tmp + ": cannot rewrite " + path);
  }
  std::filesystem::rename(tmp, path);
}

void TraceWriter::open(const std::string& path, bool append) {
  if (f_) std::fclose(f_);
  path_ = path;
  f_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (!f_) throw std::runtime_error(path + ": cannot open trace for writing");
}

void TraceWriter::write(const TraceRecord& r) {
  const std::string line = r.to_line() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw std::runtime_error(path_ + ": write failed (disk full?)");
}

void TraceWriter::sync() {
  if (!f_) return;
  if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) throw std::runtime_error(path_ + ": fsync failed");
}

TraceWriter::~TraceWriter() {
  if (f_) std::fclose(f_);
}

}  // namespace olmoref
