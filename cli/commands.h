// cli/commands.h — the subcommands of the olmoref binary.
#pragma once

#include <CLI/CLI.hpp>

namespace olmoref {

void register_commands(CLI::App& app);
int command_exit_code();  // what the subcommand that ran asked main() to return
void set_command_exit_code(int code);  // for subcommands registered elsewhere (cli/golden_commands.cpp)

}  // namespace olmoref
