// tests/data/data_cli_main.cpp — `olmoref-data`: the data commands alone, so the data tests and
// the demo corpus script do not depend on how the main binary is wired. Same commands, same
// behaviour as `olmoref tokenize` / `olmoref data ...`.
#include <CLI/CLI.hpp>

#include "cli/data_commands.h"

int main(int argc, char** argv) {
  CLI::App app{"olmoref-data: the data commands of olmoref"};
  app.require_subcommand(1);
  olmoref::data::register_data_commands(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
