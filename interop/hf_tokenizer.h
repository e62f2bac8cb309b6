// interop/hf_tokenizer.h — olmoref's byte-level BPE (data/bpe.h) <-> Hugging Face's tokenizer files.
//
// Written (write_hf_tokenizer): DIR/tokenizer.json, which the `tokenizers` library loads as
//   normalizer     none
//   pre_tokenizer  Sequence[Split(kOlmorefBytesV1Regex, Isolated), ByteLevel(add_prefix_space=false,
//                  use_regex=false)]: the Split cuts exactly olmoref-bytes-v1's chunks, ByteLevel maps each byte
//                  to GPT-2's printable stand-in character
//   model          BPE: vocab (byte-level strings -> ids, our ids unchanged) and merges in rank order
//   added_tokens   the special tokens (EOS <|endoftext|>, PAD <|pad|>), special: true
//   post_processor none (no BOS is added: Olmo 3 documents end in EOS and start with nothing)
//   decoder        ByteLevel
// and DIR/tokenizer_config.json + DIR/special_tokens_map.json for AutoTokenizer (PreTrainedTokenizerFast,
// eos/pad tokens, no BOS, split_special_tokens: true — olmoref never makes a special token from text, so the
// literal text "<|endoftext|>" is encoded as its bytes; the bare `tokenizers` library does not read that flag and
// would turn the literal text into EOS unless `tokenizer.encode_special_tokens = True`).
//
// Read (hf_tokenizer_spec, used by load_tokenizer when a file has a "model" object): a byte-level BPE whose
// pre-tokenizer is exactly the one written here; any other normalizer, pre-tokenizer, post-processor or model
// option is refused with an error naming it, since olmoref has no general regex engine.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "data/bpe.h"

namespace olmoref::interop {

// The Split pattern (Oniguruma, as `tokenizers` compiles it) equivalent to data/bpe.h's pretokenize on valid
// UTF-8: letters are ASCII letters and every non-ASCII code point (their UTF-8 bytes are all >= 0x80); the two
// whitespace alternatives give "a run of whitespace, less its last space when a non-space follows". `\s` is
// avoided on purpose: Oniguruma's \s also matches U+0085 and U+00A0, which olmoref counts as letters.
inline constexpr const char* kOlmorefBytesV1Regex =
    R"( ?[A-Za-z\x{80}-\x{10FFFF}]+| ?[0-9]+| ?[^ \t\n\r\x0B\x0CA-Za-z\x{80}-\x{10FFFF}0-9]+|)"
    R"([ \t\n\r\x0B\x0C]+(?= [^ \t\n\r\x0B\x0C])|[ \t\n\r\x0B\x0C]+)";

// GPT-2's bytes_to_unicode: the UTF-8 of the character ByteLevel writes for each byte.
const std::array<std::string, 256>& byte_level_chars();

// tokenizer.json for `tok`. Throws std::invalid_argument when two ids stand for the same bytes (a Hugging Face
// vocabulary maps each string to one id), naming both.
std::string hf_tokenizer_json(const data::BpeTokenizer& tok);

// Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into `dir` (which must exist), each
// atomically. model_max_length: the context length AutoTokenizer reports (the export's max_position_embeddings).
void write_hf_tokenizer(const std::string& dir, const data::BpeTokenizer& tok, int64_t model_max_length);

// The tokenizer in a parsed tokenizer.json at `path`. EOS and PAD come from tokenizer_config.json beside it when
// that names them (eos_token / pad_token), else from the added tokens <|endoftext|> / <|pad|>; no EOS is an error.
data::BpeTokenizer::Spec hf_tokenizer_spec(const nlohmann::json& tokenizer_json, const std::string& path);

// A tokenizer file of either kind, told apart by content (the demo's olmoref tokenizer is called tokenizer.json
// too): olmoref-bpe-v1 (data::BpeTokenizer::load) or a Hugging Face tokenizer.json; throws naming the file.
data::BpeTokenizer load_tokenizer(const std::string& path);

}  // namespace olmoref::interop
