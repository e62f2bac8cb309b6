// cli/golden_commands.h — `olmoref trace compare|plot|convert` and `olmoref golden export`.
#pragma once

#include <CLI/CLI.hpp>

namespace olmoref {

void register_golden_commands(CLI::App& app);

}  // namespace olmoref
