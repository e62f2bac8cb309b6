// data/mix.h — an ordered list of token files (a "mix"), as OLMo-core's mixes/*.txt.
//
// File order matters: global instance ids concatenate files in mix order, so reordering the
// lines of a mix changes the whole data order (and the dataset fingerprint).
//
// Mix file format (one entry per line):
//     path                  a token file
//     label,path            OLMo-core's form; the label (e.g. the source name) is kept for reports
//     # comment             ignored, as are blank lines
// Everything after the first comma is the path, so a path that contains a comma needs a label.
// Relative paths are resolved against the directory of the mix file, so a corpus directory
// with its mix files can be moved or copied as a whole.
//
// OLMo-core's own mix files (olmo_core/data/mixes/*.txt, DataMix.build) write every path relative to a base
// directory (e.g. /weka/oe-training-default/ai2-llm) with a "{TOKENIZER}" placeholder for the tokenizer's
// directory name (e.g. allenai/dolma3-tokenizer): MixResolve gives both, and such a file is read as OLMo-core reads
// it, base_dir + "/" + path with the placeholder replaced. A placeholder without a tokenizer is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref::data {

struct MixEntry {
  std::string path;   // as resolved (what is opened)
  std::string label;  // may be empty
  int64_t line = 0;   // the line of the mix file it came from (0: given as a path, not read from a file)
};

struct MixResolve {
  std::string base_dir;   // relative paths join it (OLMo-core's base_dir); empty: the mix file's directory
  std::string tokenizer;  // replaces "{TOKENIZER}"; empty: a placeholder is refused
};

struct Mix {
  std::vector<MixEntry> entries;
  std::string source;  // the mix file it came from, or "<list>" for a list of paths

  // Parses a mix file; throws naming the file if it is missing or lists no token files.
  static Mix parse_file(const std::string& mix_path, const MixResolve& resolve = {});
  // A mix from paths given directly (e.g. on the command line), in the given order.
  static Mix from_paths(const std::vector<std::string>& paths, const std::string& label = "");

  // Writes `label,path` / `path` lines, paths relative to the mix file's directory when the file
  // lies beneath it (so the corpus stays relocatable). Atomic: temp file + rename.
  void write_file(const std::string& mix_path) const;
  // Writes OLMo-core's format, which its DataMix.build parses: "label,path" on every line (a missing label
  // becomes the file's stem), path relative to base_dir with the tokenizer's name written back as "{TOKENIZER}".
  // Throws naming the file when a path is not beneath base_dir, does not contain the tokenizer name, or holds a
  // comma (OLMo-core splits each line on its one comma).
  void write_olmo_core_file(const std::string& mix_path, const MixResolve& resolve) const;

  bool empty() const { return entries.empty(); }
  size_t size() const { return entries.size(); }
};

// A file that two mixes share: the same file (equal canonical paths, so "./a.u16", "a.u16" and a symlink to it
// meet) or the same bytes under another name (equal size, then an equal XXH3-64 of the first MiB, then of the
// whole file: files of different sizes are never read, and a mismatch is usually seen in the first MiB). A file
// that cannot be opened is compared by path alone (whoever opens it next says why it cannot).
struct SharedFile {
  size_t a = 0, b = 0;     // entry indices in the two mixes
  bool same_path = false;  // else the same bytes under another name
  std::string canonical;   // same path: the file both entries name
  int64_t bytes = 0;       // same bytes: the size
  uint64_t xxh3 = 0;       // same bytes: XXH3-64 (seed 0) of the whole file
};
std::vector<SharedFile> shared_files(const Mix& a, const Mix& b);

}  // namespace olmoref::data
