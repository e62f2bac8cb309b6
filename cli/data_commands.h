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
#pragma once

namespace CLI {
class App;
}

namespace olmoref::data {

void register_data_commands(CLI::App& app);

}  // namespace olmoref::data
