// cli/data_commands.h — the data subcommands of the olmoref binary.
//
//   olmoref tokenize      train or load a BPE tokenizer, tokenize text, write token files + mixes
//   olmoref data inspect  files, tokens, documents, instances and fingerprint of a mix or files
//   olmoref data order    OLMo-core's global shuffle (print, or write as raw uint32)
//   olmoref data batches  the instance ids (and optionally tokens) of the first global batches
//   olmoref data split    deterministic document-level train/holdout split of token files
//
// Errors inside a command are printed as "error: ..." and turn into CLI::RuntimeError(1), so
// CLI11_PARSE in main() exits with status 1.
//
// And (cli/leakcheck_command.cpp) `olmoref leakcheck`: the holdout leakage detector (data/leakcheck.h) on a run's
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

void register_data_commands(CLI::App& app);
void register_leak_commands(CLI::App& app);

}  // namespace olmoref::data
