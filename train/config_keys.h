// train/config_keys.h — the one table of config keys (train/config_keys.cpp) from which reading, validation,
// writing the resolved TOML and the hashes all come. A key added to the table is read, checked, written and
// hashed; a key left out of it is refused as unknown. Before the table, each key was listed by hand in three
// places (read, validate, write), and a key forgotten in one of them silently dropped out of the resolved config
// or the resume hash.
#pragma once

#include <set>
#include <string>

#include <toml++/toml.h>

#include "train/config.h"

namespace olmoref::config_keys {

[[noreturn]] void fail(const std::string& origin, const std::string& msg);

// Typed access to the parsed TOML that records every key read, so that what nobody read is a typo and refused.
class Reader {
 public:
  Reader(const toml::table& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  // Leaves `out` as it is when the key is absent; a value of another type is an error naming the key and file.
  template <typename T>
  void get(const std::string& section, const std::string& key, T& out);

  // The node itself, for values with a structure of their own (marked as read; nullptr when absent).
  const toml::node* raw(const std::string& section, const std::string& key) {
    seen_.insert(section + "." + key);
    return root_.at_path(section + "." + key).node();
  }

  bool has(const std::string& section, const std::string& key) const {
    return root_.at_path(section + "." + key).node() != nullptr;
  }

  // Every key in the file must have been read by someone: a typo is an error, never ignored.
  void reject_unknown() const;

  [[noreturn]] void bad(const std::string& section, const std::string& key, const std::string& want) const {
    fail(origin_, "config key '" + section + "." + key + "' must be " + want);
  }
  const std::string& origin() const { return origin_; }

 private:
  const toml::table& root_;
  std::string origin_;
  std::set<std::string> seen_;
};

// Every key of the table from the file into `c` (absent keys keep c's values), then the values derived from
// others (head_dim, ffn_hidden, n_kv_heads) and the checks that need to know what the file gave.
void read_keys(Reader& r, TrainConfig& c);

// Each key's validation, in table order; throws std::invalid_argument("config key 'K': why").
void check_keys(const TrainConfig& c);

// The written keys of `c`. For the resume hash (what must match to resume a run bit for bit), the keys that never
// change a bit are written at a neutral value (they stay in the text, as they always did) and [eval] is left out.
enum class Purpose { resolved, resume_hash };
toml::table write_keys(const TrainConfig& c, Purpose purpose);

}  // namespace olmoref::config_keys
