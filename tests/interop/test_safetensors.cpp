// Tests for interop/safetensors and interop/hf_export: round trips, every malformed-file error, and the HF export.
#include <doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "interop/hf_export.h"
#include "interop/safetensors.h"
#include "core/model_config.h"
#include "core/params.h"

using namespace olmoref;
namespace fs = std::filesystem;

namespace {

// A scratch directory per test case, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("olmoref-golden-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

template <typename T>
SafeTensor tensor_of(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                     const std::vector<T>& values) {
  SafeTensor t{name, dtype, std::move(shape), std::vector<uint8_t>(values.size() * sizeof(T))};
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file from a raw header text and data region, with an optional lie in the length field.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t length_override = -1) {
  const uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::vector<uint8_t> bytes(8 + header.size() + data_bytes, 0x5a);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  spit(path, bytes);
}

// The header of two F32 tensors `a` and `second` of `n` elements at byte offsets [a0, a1) and [b0, b1).
std::string two_f32_tensors(const std::string& second, int n, int a0, int a1, int b0, int b1) {
  std::string header = "{";
  for (const auto& [name, begin, end] : {std::tuple<std::string, int, int>{"a", a0, a1}, {second, b0, b1}}) {
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(end) + "]}";
  }
  return header + "}";
}

// Runs read_safetensors and returns the error message ("" when it did not throw).
std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

ModelConfig tiny_config() {
  ModelConfig c{.name = "tiny", .vocab_size = 64, .d_model = 16, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                .head_dim = 4, .ffn_hidden = 32, .rope_theta = 10000.0, .norm_eps = 1e-5f, .swa_pattern = {8, -1},
                .moe = {}};
  return c;
}

// Value j of parameter p is p + j/2^16: exact in fp32, and any misplaced tensor or element shows.
std::vector<float> recognisable_fill(const ParamLayout& layout) {
  std::vector<float> v(static_cast<size_t>(layout.total));
  for (size_t p = 0; p < layout.params.size(); ++p)
    for (int64_t j = 0; j < layout.params[p].numel; ++j)
      v[static_cast<size_t>(layout.params[p].offset + j)] = static_cast<float>(p) + static_cast<float>(j) / 65536.0f;
  return v;
}

}  // namespace

TEST_CASE("safetensors: round trip of every supported dtype, scalars, empty tensors and metadata") {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  std::vector<SafeTensor> ts = {
      tensor_of<float>("w", "F32", {2, 3}, {1.5f, -2.f, 0.f, 3.25f, 1e-30f, -0.f}),
      tensor_of<uint16_t>("h", "BF16", {3}, {f32_to_bf16(1.0f), f32_to_bf16(-2.5f), f32_to_bf16(3.0e38f)}),
      tensor_of<int32_t>("i", "I32", {2}, {-7, 2147483647}),
      tensor_of<uint32_t>("tokens", "U32", {1, 4}, {0u, 100257u, 4294967295u, 5u}),
      tensor_of<int64_t>("big", "I64", {}, {-(int64_t{1} << 40)}),
      tensor_of<float>("empty", "F32", {0, 5}, {}),
  };
  write_safetensors(path, ts, {{"format", "pt"}, {"note", "round trip"}});
  CHECK_FALSE(fs::exists(path + ".tmp"));

  // Header length is 8-aligned so tensor data starts aligned, as in the reference writer.
  const auto raw = slurp(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(raw[i]) << (8 * i);
  CHECK(n % 8 == 0);

  const SafetensorsFile f = read_safetensors(path);
  CHECK(f.metadata.at("format") == "pt");
  CHECK(f.metadata.at("note") == "round trip");
  REQUIRE(f.tensors.size() == ts.size());
  // Data is laid out in insertion order.
  for (size_t i = 0; i < ts.size(); ++i) CHECK(f.tensors[i].name == ts[i].name);
  for (const auto& t : ts) {
    const SafeTensor r = f.read(t.name);
    CHECK(r.dtype == t.dtype);
    CHECK(r.shape == t.shape);
    CHECK(r.bytes == t.bytes);
  }
  CHECK(f.as_f32("w") == std::vector<float>{1.5f, -2.f, 0.f, 3.25f, 1e-30f, -0.f});
  const auto h = f.as_f32("h");
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.5f);
  CHECK(f.info("big").numel() == 1);
  CHECK(f.find("nope") == nullptr);
  CHECK_THROWS_WITH_AS(f.info("nope"), doctest::Contains("no tensor named 'nope'"), std::runtime_error);
  CHECK_THROWS_WITH_AS(f.as_f32("tokens"), doctest::Contains("only F32, BF16 and F16"), std::runtime_error);

  // Overwriting replaces the file atomically.
  write_safetensors(path, std::vector<SafeTensor>{ts[0]});
  CHECK(read_safetensors(path).tensors.size() == 1);
}

TEST_CASE("safetensors: bf16 conversion rounds to nearest even and keeps NaN") {
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  CHECK(f32_to_bf16(1.0f + 1.0f / 256.0f) == 0x3f80);
  CHECK(f32_to_bf16(1.0f + 3.0f / 256.0f) == 0x3f82);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(nan))));
}

TEST_CASE("safetensors: writer refuses inconsistent input") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  auto a = tensor_of<float>("a", "F32", {2}, {1.f, 2.f});
  CHECK_THROWS_WITH_AS(write_safetensors(path, std::vector<SafeTensor>{a, a}), doctest::Contains("appears twice"),
                       std::invalid_argument);
  auto wrong = tensor_of<float>("b", "F32", {3}, {1.f, 2.f});
  CHECK_THROWS_WITH_AS(write_safetensors(path, std::vector<SafeTensor>{wrong}), doctest::Contains("needs 12 bytes"),
                       std::invalid_argument);
  auto reserved = tensor_of<float>("__metadata__", "F32", {1}, {1.f});
  CHECK_THROWS_AS(write_safetensors(path, std::vector<SafeTensor>{reserved}), std::invalid_argument);
  auto bad = tensor_of<float>("c", "F31", {1}, {1.f});
  CHECK_THROWS_WITH_AS(write_safetensors(path, std::vector<SafeTensor>{bad}),
                       doctest::Contains("unknown safetensors dtype"), std::runtime_error);
  CHECK_FALSE(fs::exists(path));
  CHECK_THROWS_WITH_AS(write_safetensors(dir.file("no/such/dir/x.safetensors"), std::vector<SafeTensor>{a}),
                       doctest::Contains("cannot create"), std::runtime_error);
}

TEST_CASE("safetensors: every malformed file is refused with a message naming the file") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, std::vector<SafeTensor>{tensor_of<float>("a", "F32", {2}, {1.f, 2.f}),
                                                  tensor_of<float>("b", "F32", {2}, {3.f, 4.f})});
  const auto bytes = slurp(good);
  const std::string p = dir.file("bad.safetensors");

  SUBCASE("missing file") { CHECK(contains(read_error(dir.file("absent.safetensors")), "absent.safetensors")); }
  SUBCASE("shorter than the length field") {
    spit(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5));
    const auto e = read_error(p);
    CHECK(contains(e, p));
    CHECK(contains(e, "truncated"));
  }
  SUBCASE("truncated data") {
    spit(p, std::vector<uint8_t>(bytes.begin(), bytes.end() - 3));
    const auto e = read_error(p);
    CHECK(contains(e, p));
    CHECK(contains(e, "run past the end of the data"));
  }
  SUBCASE("header length larger than the file") {
    auto b = bytes;
    const uint64_t n = b.size();  // more than what follows the length field
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
    spit(p, b);
    CHECK(contains(read_error(p), "larger than the rest of the file"));
  }
  SUBCASE("header length beyond the format limit") {
    auto b = bytes;
    for (int i = 0; i < 8; ++i) b[i] = 0xff;
    spit(p, b);
    CHECK(contains(read_error(p), "exceeds the safetensors limit"));
  }
  SUBCASE("header that is not JSON") {
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", ", 0);
    CHECK(contains(read_error(p), "not valid JSON"));
  }
  SUBCASE("header that is not an object") {
    write_raw(p, "[1, 2]  ", 0);
    CHECK(contains(read_error(p), "must be a JSON object"));
  }
  SUBCASE("overlapping offsets") {
    write_raw(p, two_f32_tensors("b", 2, 0, 8, 4, 12), 12);
    const auto e = read_error(p);
    CHECK(contains(e, "overlap"));
    CHECK(contains(e, "'a'"));
    CHECK(contains(e, "'b'"));
  }
  SUBCASE("gap between tensors") {
    write_raw(p, two_f32_tensors("b", 1, 0, 4, 8, 12), 12);
    CHECK(contains(read_error(p), "gap of 4 unused bytes"));
  }
  SUBCASE("trailing bytes") {
    write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
    CHECK(contains(read_error(p), "trailing bytes"));
  }
  SUBCASE("bad dtype") {
    write_raw(p, R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4);
    const auto e = read_error(p);
    CHECK(contains(e, "unknown safetensors dtype 'F31'"));
    CHECK(contains(e, "tensor 'a'"));
  }
  SUBCASE("dtype size inconsistent with shape") {
    write_raw(p, R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4);
    CHECK(contains(read_error(p), "needs 6 bytes"));
  }
  SUBCASE("negative dimension") {
    write_raw(p, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
    CHECK(contains(read_error(p), "non-negative integers"));
  }
  SUBCASE("offsets out of order") {
    write_raw(p, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4);
    CHECK(contains(read_error(p), "end before they begin"));
  }
  SUBCASE("missing field") {
    write_raw(p, R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4);
    CHECK(contains(read_error(p), "dtype, shape and data_offsets"));
  }
  SUBCASE("duplicate names") {
    write_raw(p, two_f32_tensors("a", 1, 0, 4, 4, 8), 8);
    CHECK(contains(read_error(p), "more than once"));
  }
  SUBCASE("non-string metadata") {
    write_raw(p, R"({"__metadata__":{"step":3},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
    CHECK(contains(read_error(p), "must be a string"));
  }
  SUBCASE("the good file is fine") { CHECK(read_error(good).empty()); }
}

TEST_CASE("hf_export: config.json describes the model for Olmo3ForCausalLM") {
  const ModelConfig cfg = tiny_config();
  const auto c = nlohmann::json::parse(hf_config_json(cfg));
  CHECK(c["architectures"] == nlohmann::json::array({"Olmo3ForCausalLM"}));
  CHECK(c["model_type"] == "olmo3");
  CHECK(c["vocab_size"] == 64);
  CHECK(c["hidden_size"] == 16);
  CHECK(c["intermediate_size"] == 32);
  CHECK(c["num_hidden_layers"] == 2);
  CHECK(c["num_attention_heads"] == 4);
  CHECK(c["num_key_value_heads"] == 2);
  CHECK(c["head_dim"] == 4);
  CHECK(c["rms_norm_eps"].get<double>() == 1e-5);  // the float's shortest decimal, not 9.99999975e-06
  CHECK(c["rope_parameters"]["full_attention"]["rope_theta"] == 10000.0);
  CHECK(c["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0);
  CHECK(c["rope_parameters"]["sliding_attention"]["rope_type"] == "default");
  CHECK(c["rope_parameters"]["full_attention"]["rope_type"] == "default");
  CHECK(c["rope_theta"] == 10000.0);
  // YaRN (Olmo 3's long-context stage) on the full-attention layers only, as OLMo-core's to_hf_config writes it.
  ModelConfig yarn = cfg;
  yarn.rope_scaling.kind = RopeScalingKind::yarn;
  const auto cy = nlohmann::json::parse(hf_config_json(yarn));
  CHECK(cy["rope_parameters"]["full_attention"]["rope_type"] == "yarn");
  CHECK(cy["rope_parameters"]["full_attention"]["factor"] == 8.0);
  CHECK(cy["rope_parameters"]["full_attention"]["original_max_position_embeddings"] == 8192);
  CHECK(cy["rope_parameters"]["full_attention"]["beta_fast"] == 32);
  CHECK(cy["rope_parameters"]["full_attention"]["beta_slow"] == 1);
  CHECK(cy["rope_parameters"]["full_attention"]["attention_factor"].get<double>() ==
        doctest::Approx(1.2079441541679836).epsilon(1e-15));
  CHECK(cy["rope_parameters"]["sliding_attention"]["rope_type"] == "default");
  CHECK(c["sliding_window"] == 8);
  CHECK(c["layer_types"] == nlohmann::json::array({"sliding_attention", "full_attention"}));
  CHECK(c["attention_bias"] == false);
  CHECK(c["tie_word_embeddings"] == false);
  CHECK(c["dtype"] == "float32");
  CHECK(c["max_position_embeddings"] == 8192);
  // dolma2's ids do not fit a 64-token vocabulary, so they are left out rather than breaking nn.Embedding.
  CHECK(c["eos_token_id"].is_null());
  CHECK(c["pad_token_id"].is_null());

  HfExportOptions o;
  o.eos_token_id = 3;
  o.pad_token_id = 5;
  o.max_position_embeddings = 128;
  const auto c2 = nlohmann::json::parse(hf_config_json(cfg, o));
  CHECK(c2["eos_token_id"] == 3);
  CHECK(c2["pad_token_id"] == 5);
  CHECK(c2["max_position_embeddings"] == 128);
  o.pad_token_id = 64;
  CHECK_THROWS_WITH_AS(hf_config_json(cfg, o), doctest::Contains("outside the vocabulary"), std::invalid_argument);

  ModelConfig big = cfg;
  big.vocab_size = 100352;
  const auto c3 = nlohmann::json::parse(hf_config_json(big));
  CHECK(c3["eos_token_id"] == 100257);
  CHECK(c3["pad_token_id"] == 100277);

  // The last layer is always full; with a 4-layer [8,8,8,-1] pattern that is HF's own default layout.
  ModelConfig four = cfg;
  four.n_layers = 4;
  four.swa_pattern = {8, 8, 8, -1};
  CHECK(nlohmann::json::parse(hf_config_json(four))["layer_types"] ==
        nlohmann::json::array({"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}));

  // All-full models still need a sliding_window value for HF's mask builder.
  ModelConfig full = cfg;
  full.swa_pattern = {-1};
  const auto c4 = nlohmann::json::parse(hf_config_json(full));
  CHECK(c4["layer_types"] == nlohmann::json::array({"full_attention", "full_attention"}));
  CHECK(c4["sliding_window"] == 8192);

  ModelConfig mixed = four;
  mixed.swa_pattern = {8, 16, -1};
  CHECK_THROWS_WITH_AS(hf_config_json(mixed), doctest::Contains("single `sliding_window`"), std::invalid_argument);
}

TEST_CASE("hf_export: export then import reproduces every parameter bit for bit") {
  TempDir dir;
  const ModelConfig cfg = tiny_config();
  const ParamLayout layout(cfg);
  const std::vector<float> params = recognisable_fill(layout);
  const std::string ckpt = dir.file("hf");
  export_hf_checkpoint(ckpt, cfg, layout, params.data());
  CHECK(fs::exists(ckpt + "/config.json"));
  CHECK_FALSE(fs::exists(ckpt + "/config.json.tmp"));
  CHECK_FALSE(fs::exists(ckpt + "/model.safetensors.tmp"));

  // The file holds each parameter under its HF name, fp32, in our canonical order.
  const SafetensorsFile f = read_safetensors(ckpt + "/model.safetensors");
  CHECK(f.metadata.at("format") == "pt");
  REQUIRE(f.tensors.size() == layout.params.size());
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const auto& p = layout.params[i];
    CHECK(f.tensors[i].name == p.hf_name);
    CHECK(f.tensors[i].dtype == "F32");
    CHECK(f.tensors[i].shape == p.shape);
    const auto v = f.as_f32(p.hf_name);
    CHECK(std::memcmp(v.data(), params.data() + p.offset, v.size() * sizeof(float)) == 0);
  }
  CHECK(f.info("model.layers.1.self_attn.k_proj.weight").shape == std::vector<int64_t>{8, 16});
  CHECK(f.info("model.layers.0.mlp.down_proj.weight").shape == std::vector<int64_t>{16, 32});

  std::vector<float> back(params.size(), -1.f);
  import_hf_checkpoint(ckpt, cfg, layout, back.data());
  CHECK(std::memcmp(back.data(), params.data(), params.size() * sizeof(float)) == 0);
}

TEST_CASE("hf_export: import converts bf16 and refuses checkpoints that do not fit") {
  TempDir dir;
  const ModelConfig cfg = tiny_config();
  const ParamLayout layout(cfg);
  const std::vector<float> params = recognisable_fill(layout);
  const std::string ckpt = dir.file("hf");
  export_hf_checkpoint(ckpt, cfg, layout, params.data());
  std::vector<float> back(params.size());

  auto import_error = [&](const ModelConfig& c) -> std::string {
    const ParamLayout l(c);
    std::vector<float> buf(static_cast<size_t>(l.total));
    try {
      import_hf_checkpoint(ckpt, c, l, buf.data());
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };

  SUBCASE("bf16 tensors are widened to fp32") {
    std::vector<SafeTensor> ts;
    for (const auto& p : layout.params) {
      std::vector<uint16_t> h(static_cast<size_t>(p.numel));
      for (int64_t j = 0; j < p.numel; ++j) h[static_cast<size_t>(j)] = f32_to_bf16(params[p.offset + j]);
      ts.push_back(tensor_of<uint16_t>(p.hf_name, "BF16", p.shape, h));
    }
    write_safetensors(ckpt + "/model.safetensors", ts, {{"format", "pt"}});
    import_hf_checkpoint(ckpt, cfg, layout, back.data());
    for (size_t i = 0; i < params.size(); ++i) REQUIRE(back[i] == bf16_to_f32(f32_to_bf16(params[i])));
  }
  SUBCASE("config.json that disagrees with the model config") {
    ModelConfig c = cfg;
    c.n_heads = 2;  // same q width (2 x 8 = 4 x 4): only config.json can tell
    c.n_kv_heads = 1;
    c.head_dim = 8;
    const auto e = import_error(c);
    CHECK(contains(e, "config.json"));
    CHECK(contains(e, "num_attention_heads"));
    ModelConfig t = cfg;
    t.rope_theta = 500000.0;
    CHECK(contains(import_error(t), "rope_parameters.full_attention.rope_theta"));
    ModelConfig w = cfg;
    w.swa_pattern = {4, -1};
    CHECK(contains(import_error(w), "sliding_window"));
    // A plain-RoPE checkpoint is not a YaRN model's, and a YaRN checkpoint must match the config's settings.
    ModelConfig yarn = cfg;
    yarn.rope_scaling.kind = RopeScalingKind::yarn;
    CHECK(contains(import_error(yarn), "rope_parameters.full_attention.rope_type is \"default\""));
    const ParamLayout yl(yarn);
    export_hf_checkpoint(ckpt, yarn, yl, params.data());
    CHECK(import_error(yarn).empty());
    CHECK(contains(import_error(cfg), "rope_parameters.full_attention.rope_type is \"yarn\""));
    ModelConfig other = yarn;
    other.rope_scaling.factor = 4.0;
    CHECK(contains(import_error(other), "rope_parameters.full_attention.factor"));
    ModelConfig everywhere = yarn;
    everywhere.rope_scaling.full_attention_only = false;
    CHECK(contains(import_error(everywhere), "rope_parameters.sliding_attention.rope_type is \"default\""));
  }
  SUBCASE("more layers in the file than in the config, or fewer") {
    fs::remove(ckpt + "/config.json");  // so the tensor checks are what refuses
    ModelConfig one = cfg;
    one.n_layers = 1;
    const auto e = import_error(one);
    CHECK(contains(e, "unexpected tensor 'model.layers.1.self_attn.q_proj.weight'"));
    ModelConfig three = cfg;
    three.n_layers = 3;
    CHECK(contains(import_error(three), "missing tensor 'model.layers.2.self_attn.q_proj.weight'"));
  }
  SUBCASE("wrong shape names the tensor and the fix") {
    fs::remove(ckpt + "/config.json");
    ModelConfig c = cfg;
    c.vocab_size = 128;
    const auto e = import_error(c);
    CHECK(contains(e, "tensor 'model.embed_tokens.weight' has shape [64, 16], expected [128, 16]"));
    CHECK(contains(e, "model.vocab_size"));
  }
  SUBCASE("a missing tensor") {
    std::vector<SafeTensor> ts;
    for (const auto& p : layout.params)
      if (p.hf_name != "model.norm.weight") ts.push_back(make_f32_tensor(p.hf_name, p.shape, params.data() + p.offset));
    write_safetensors(ckpt + "/model.safetensors", ts, {{"format", "pt"}});
    CHECK(contains(import_error(cfg), "missing tensor 'model.norm.weight'"));
  }
  SUBCASE("an integer tensor") {
    std::vector<SafeTensor> ts;
    for (const auto& p : layout.params) {
      ts.push_back(make_f32_tensor(p.hf_name, p.shape, params.data() + p.offset));
      if (p.hf_name == "model.norm.weight") ts.back().dtype = "I32";
    }
    write_safetensors(ckpt + "/model.safetensors", ts, {{"format", "pt"}});
    CHECK(contains(import_error(cfg), "has dtype I32"));
  }
  SUBCASE("sharded checkpoints via model.safetensors.index.json") {
    std::vector<SafeTensor> a, b;
    nlohmann::json map;
    for (size_t i = 0; i < layout.params.size(); ++i) {
      const auto& p = layout.params[i];
      (i % 2 ? a : b).push_back(make_f32_tensor(p.hf_name, p.shape, params.data() + p.offset));
      map[p.hf_name] = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    fs::remove(ckpt + "/model.safetensors");
    write_safetensors(ckpt + "/model-00001-of-00002.safetensors", a, {{"format", "pt"}});
    write_safetensors(ckpt + "/model-00002-of-00002.safetensors", b, {{"format", "pt"}});
    std::ofstream(ckpt + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
    import_hf_checkpoint(ckpt, cfg, layout, back.data());
    CHECK(back == params);
  }
  SUBCASE("no weights at all") {
    fs::remove(ckpt + "/model.safetensors");
    CHECK(contains(import_error(cfg), "no model.safetensors"));
  }
}

TEST_CASE("hf_export: models HF cannot represent are refused before anything is written") {
  TempDir dir;
  ModelConfig cfg = tiny_config();
  cfg.n_layers = 3;
  cfg.swa_pattern = {8, 4, -1};
  const ParamLayout layout(cfg);
  const std::vector<float> params(static_cast<size_t>(layout.total), 0.f);
  CHECK_THROWS_WITH_AS(export_hf_checkpoint(dir.file("hf"), cfg, layout, params.data()),
                       doctest::Contains("Hugging Face Olmo3Config has a single"), std::invalid_argument);
  CHECK_FALSE(fs::exists(dir.file("hf")));
}
