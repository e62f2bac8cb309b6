// cli/leakcheck_command.h — `olmoref leakcheck`: the holdout leakage detector (data/leakcheck.h) on a run's
// configuration, through the same loader configuration path as `olmoref train`.
//
//   olmoref leakcheck --config FILE [--set k=v ...] [--steps N | --epoch] [--ngram 13] [--bloom]
//                     [--audit FILE ...] [--report out.json] [...]
//
// Prints a short summary; writes the JSON report with --report (docs/formats/leakcheck.md).
// Exit status: 0 clean, 1 contamination or an audit failure found, 2 could not check.
#pragma once

namespace CLI {
class App;
}

namespace olmoref::data {

void register_leak_commands(CLI::App& app);

}  // namespace olmoref::data
