// tests/core/documents_dump.cpp — core/documents.h on instances from stdin, for tests/core/documents_peer.py: each
// input line "EOS t0 t1 ... t(T-1)", each output line {"lengths": [...], "start": [...], "rope_position": [...]}.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/documents.h"

namespace {
void print(const char* name, const std::vector<int32_t>& v, bool last) {
  std::cout << '"' << name << "\": [";
  for (size_t i = 0; i < v.size(); ++i) std::cout << (i ? ", " : "") << v[i];
  std::cout << ']' << (last ? "" : ", ");
}
}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    uint32_t eos = 0, t = 0;
    if (!(in >> eos)) continue;
    std::vector<uint32_t> tokens;
    while (in >> t) tokens.push_back(t);
    const auto lengths = olmoref::document_lengths(tokens.data(), static_cast<int64_t>(tokens.size()), eos);
    const auto p = olmoref::document_positions(tokens.data(), static_cast<int64_t>(tokens.size()), eos);
    std::cout << '{';
    print("lengths", lengths, false);
    print("start", p.start, false);
    print("rope_position", p.rope_position, true);
    std::cout << "}\n";
  }
  return 0;
}
