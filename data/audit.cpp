#include "data/audit.h"

#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/json_file.h"

namespace olmoref::data {

uint64_t xxh3_tokens(std::span<const uint32_t> tokens) {
  // The host is little-endian (static_assert in token_file.h), so the bytes in memory are the
  // little-endian encoding the format promises.
  return XXH3_64bits(tokens.data(), tokens.size() * sizeof(uint32_t));
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// JSON string literal; paths almost never need escaping, so the common case is a plain copy.
static void append_json_string(std::string& out, const std::string& s) {
  const bool plain = std::none_of(s.begin(), s.end(), [](char c) {
    return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x80;
  });
  if (plain) {
    out += '"';
    out += s;
    out += '"';
  } else {
    out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

std::string audit_record_json(const AuditRecord& r) {
  // Written by hand rather than through a json object: the key order is fixed and readable, and
  // this runs once per instance per step.
  char head[256];
  std::snprintf(head, sizeof head,
                "{\"step\":%lld,\"epoch\":%lld,\"batch\":%lld,\"microbatch\":%lld,\"rank\":%lld,\"instance\":%lld,"
                "\"file\":",
                static_cast<long long>(r.step), static_cast<long long>(r.epoch), static_cast<long long>(r.batch),
                static_cast<long long>(r.microbatch), static_cast<long long>(r.rank), static_cast<long long>(r.instance));
  char tail[160];
  std::snprintf(tail, sizeof tail, ",\"file_index\":%lld,\"token_start\":%lld,\"token_end\":%lld,\"xxh3\":\"%016llx\"}",
                static_cast<long long>(r.file_index), static_cast<long long>(r.token_start),
                static_cast<long long>(r.token_end), static_cast<unsigned long long>(r.xxh3));
  std::string s = head;
  append_json_string(s, r.file);
  s += tail;
  if (!r.documents.empty()) {
    s.pop_back();  // the closing brace: the documents go last, so a line without them reads as before
    s += ",\"documents\":[";
    for (size_t i = 0; i < r.documents.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(r.documents[i]);
    }
    s += "]}";
  }
  return s;
}

AuditRecord parse_audit_record(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line);
  AuditRecord r;
  r.step = j.at("step").get<int64_t>();
  r.epoch = j.at("epoch").get<int64_t>();
  r.batch = j.at("batch").get<int64_t>();
  r.microbatch = j.at("microbatch").get<int64_t>();
  r.rank = j.at("rank").get<int64_t>();
  r.instance = j.at("instance").get<int64_t>();
  r.file = j.at("file").get<std::string>();
  r.file_index = j.at("file_index").get<int64_t>();
  r.token_start = j.at("token_start").get<int64_t>();
  r.token_end = j.at("token_end").get<int64_t>();
  r.xxh3 = std::stoull(j.at("xxh3").get<std::string>(), nullptr, 16);
  if (j.contains("documents")) r.documents = j.at("documents").get<std::vector<int32_t>>();
  return r;
}

AuditLog::AuditLog(std::string path, Mode mode) : path_(std::move(path)) {
  f_ = std::fopen(path_.c_str(), mode == Mode::append ? "ab" : "wb");
  if (f_ == nullptr) {
    throw std::runtime_error("audit log '" + path_ + "': cannot open for writing (" + std::strerror(errno) +
                             "); does the directory exist?");
  }
}

AuditLog::~AuditLog() {
  if (f_ != nullptr) std::fclose(f_);
}

void AuditLog::write(const AuditRecord& r) {
  const std::string line = audit_record_json(r) + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size()) {
    throw std::runtime_error("audit log '" + path_ + "': write failed (" + std::strerror(errno) + ")");
  }
}

void AuditLog::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  // fsync too: the trainer calls this before a checkpoint becomes complete, so the log holds every step it does.
  if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0)
    throw std::runtime_error("audit log '" + path_ + "': flush failed");
}

std::vector<AuditRecord> read_audit_log(const std::string& path) {
  return read_json_lines<AuditRecord>(
      path, "audit log '" + path + "': cannot open", parse_audit_record, [&](int64_t line_no, const char* why) {
        return "audit log '" + path + "' line " + std::to_string(line_no) + ": malformed record (" + why + ")";
      });
}

}  // namespace olmoref::data
