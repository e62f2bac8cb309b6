// data/json_file.h — reading the project's JSON and JSON Lines files with errors that name the file (and line)
// and say what to do: the tokenizer and the split manifest (one document each), the audit log and the trace
// (one record per line).
#pragma once

#include <cstdint>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace olmoref::data {

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
