// train/step_list.h — a comma-separated list of steps as the commands take it (`--at 4,8`, `--states 1,5,10`): one
// parser, so every option refuses the same malformed text with the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref {

// "4,8" -> {4, 8}, in the order given. Throws std::invalid_argument naming `option` and the item for an empty item or
// one that is not a whole integer ("--at 4,x: 'x' is not a step"); `hint` (if any) is appended to say what would
// work. Ranges are the caller's: what a step may be depends on the run.
std::vector<int64_t> parse_step_list(const std::string& text, const std::string& option, const std::string& hint = "");

}  // namespace olmoref
