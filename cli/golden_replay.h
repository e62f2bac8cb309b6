// cli/golden_replay.h — `olmoref golden replay`: a framework's own trainer replays a golden bundle (golden_replay.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace olmoref {

void register_golden_replay(CLI::App& golden);

}  // namespace olmoref
