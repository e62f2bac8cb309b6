// core/hex.h — fp32 bit patterns as traces, checkpoints and dumps write them: 8 lower-case hex digits, so a value
// round-trips exactly and two files compare by text.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <string>

namespace olmoref {

inline std::string hex32(uint32_t x) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", x);
  return buf;
}

inline std::string f32_hex(float x) { return hex32(std::bit_cast<uint32_t>(x)); }

}  // namespace olmoref
