#include "train/config.h"

#include "train/config_keys.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>
#include <xxhash.h>
#include <cstdio>

namespace olmoref {

namespace {

using config_keys::fail;

// Applies "section.key=value" to the parsed table before anything reads it, so an override is
// validated exactly like a value written in the file.
void apply_override(toml::table& root, const std::string& ov, const std::string& origin) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos) fail(origin, "override '" + ov + "' must look like section.key=value");
  const std::string path = ov.substr(0, eq), value = ov.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size())
    fail(origin, "override '" + ov + "': the key must be section.key (e.g. optim.lr=1e-3)");
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: take it as a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  if (!sec) fail(origin, "override '" + ov + "': '" + section + "' is not a section");
  sec->insert_or_assign(key, *parsed["v"].node());
}

}  // namespace

TrainConfig parse_config_text(const std::string& toml_text, const std::string& origin,
                              const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "TOML syntax error at line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
        << e.description();
    fail(origin, msg.str());
  }
  for (const auto& ov : overrides) apply_override(root, ov, origin);

  TrainConfig c;
  c.source_path = origin;
  c.overrides = overrides;
  config_keys::Reader r(root, origin);
  config_keys::read_keys(r, c);
  r.reject_unknown();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(origin, e.what());
  }
  return c;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (std::filesystem::is_directory(path))
    throw std::invalid_argument(path + ": a directory, not a config file (give a .toml file; shipped configs are in "
                                "configs/)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot open config file (check the path; shipped configs are in configs/)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config_text(ss.str(), path, overrides);
}

void TrainConfig::validate() const {
  model.validate();
  config_keys::check_keys(*this);
  // Every group's peak must admit the schedule's floors; the patterns must match (OLMo-core's strict build).
  const std::vector<ParamGroup> groups = param_groups(optim, ParamLayout(model));
  for (const ParamGroup& g : groups) validate_schedule(schedule, g.lr);
}

namespace {
std::string written_text(const TrainConfig& c, config_keys::Purpose purpose) {
  std::ostringstream out;
  out << toml::toml_formatter(config_keys::write_keys(c, purpose));
  return out.str();
}

std::string hash_text(const std::string& s) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(s.data(), s.size())));
  return buf;
}
}  // namespace

std::string TrainConfig::to_toml() const { return written_text(*this, config_keys::Purpose::resolved); }

// Both hashes follow from the written form, so a key reaches them exactly as it reaches the resolved TOML.
std::string TrainConfig::model_hash() const {
  TrainConfig c;
  c.model = model;
  const std::string full = c.to_toml();
  return hash_text(full.substr(full.find("[model]")));
}

std::string TrainConfig::resume_hash() const {
  return hash_text(written_text(*this, config_keys::Purpose::resume_hash));
}

namespace {
// Every value of a written config, by its dotted key, as TOML writes it.
void flatten(const toml::table& t, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  for (const auto& [key, node] : t) {
    const std::string name = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      flatten(*sub, name, out);
    } else {
      std::ostringstream v;
      node.visit([&v](const auto& x) { v << x; });
      out.emplace_back(name, v.str());
    }
  }
}
}  // namespace

std::vector<std::string> resume_key_differences(const TrainConfig& recorded, const TrainConfig& now) {
  std::vector<std::pair<std::string, std::string>> was, is;
  flatten(config_keys::write_keys(recorded, config_keys::Purpose::resume_hash), "", was);
  flatten(config_keys::write_keys(now, config_keys::Purpose::resume_hash), "", is);
  std::vector<std::string> out;
  auto value_in = [](const std::vector<std::pair<std::string, std::string>>& kv, const std::string& key) {
    for (const auto& [k, v] : kv)
      if (k == key) return v;
    return std::string("(absent)");
  };
  for (const auto& [key, value] : is)
    if (const std::string before = value_in(was, key); before != value) out.push_back(key + ": " + before + " -> " + value);
  for (const auto& [key, value] : was)
    if (value_in(is, key) == "(absent)") out.push_back(key + ": " + value + " -> (absent)");
  return out;
}

std::string TrainConfig::pytorch_replay_unsupported() const {
  if (optim.skip_step())
    return "optim.kind = \"skip_step_adamw\": the PyTorch replays run plain AdamW (SkipStepAdamW is checked against "
           "OLMo-core's own optimizer by tests/core)";
  if (optim.group_overrides_set)
    return "optim.group_overrides is set: the PyTorch replays use the Olmo 3 default groups (embeddings.weight "
           "without weight decay); remove the key to use them";
  return "";
}

}  // namespace olmoref
