// data/json_file.h — reading the project's JSON and JSON Lines files with errors that name the file (and line)
// and say what to do: the tokenizer and the split manifest (one document each), the audit log and the trace
// (one record per line).
#pragma once

#include <cstdint>
#include <exception>
#include <fstream>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>
#include <xxhash.h>

namespace olmoref::data {

// A JSON Lines record that checks itself (the trace's lines: docs/formats/trace.md): its last key, "record_xxh3", is the
// XXH3-64 (16 hex digits) of the line's bytes without it, so a line changed after it was written is found where it
// is read. with_record_checksum takes a one-line JSON object and returns it with the key added.
inline constexpr const char* kRecordChecksumKey = "record_xxh3";
inline std::string record_checksum_of(const std::string& body) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(body.data(), body.size())));
  return hex;
}
inline std::string with_record_checksum(const std::string& object) {
  const std::string sum = record_checksum_of(object);
  return object.substr(0, object.size() - 1) + ",\"" + kRecordChecksumKey + "\":\"" + sum + "\"}";
}
// Empty when `line` carries no record_xxh3 (a line written before it was recorded, or by another tool) or a matching
// one; else what does not match.
inline std::string record_checksum_mismatch(const std::string& line) {
  const std::string key = std::string(",\"") + kRecordChecksumKey + "\":\"";
  const size_t at = line.rfind(key);
  if (at == std::string::npos) return "";
  const size_t hex_at = at + key.size();
  const size_t end = line.find_last_not_of(" \t\r");
  if (end == std::string::npos || end < hex_at + 17 || line.compare(hex_at + 16, 2, "\"}") != 0 || end != hex_at + 17)
    return "its record_xxh3 is not the last key with 16 hex digits";
  const std::string want = line.substr(hex_at, 16), got = record_checksum_of(line.substr(0, at) + "}");
  if (want == got) return "";
  return "its record_xxh3 is " + want + " but its bytes hash to " + got + ": the line changed after it was written";
}

// The JSON document at `path`, which is `what` ("tokenizer", "split manifest"). A file that cannot be opened throws
// "WHAT 'PATH': cannot open" + cannot_open_hint (its fix), one that does not parse "WHAT 'PATH': not valid JSON (...)".
inline nlohmann::json read_json_file(const std::string& path, const std::string& what,
                                     const std::string& cannot_open_hint) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(what + " '" + path + "': cannot open" + cannot_open_hint);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(what + " '" + path + "': not valid JSON (" + e.what() + ")");
  }
}

// parse(line) of every non-empty line of the JSON Lines file at `path`, in order. A file that cannot be opened throws
// `cannot_open`; a line whose parse throws, bad_line(line number from 1, the parse's message).
template <class Record, class Parse, class BadLine>
std::vector<Record> read_json_lines(const std::string& path, const std::string& cannot_open, const Parse& parse,
                                    const BadLine& bad_line) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(cannot_open);
  std::vector<Record> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    try {
      out.push_back(parse(line));
    } catch (const std::exception& e) {
      throw std::runtime_error(bad_line(line_no, e.what()));
    }
  }
  return out;
}

}  // namespace olmoref::data
