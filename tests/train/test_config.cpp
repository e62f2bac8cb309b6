// Config parsing: shipped configs, overrides, and errors that name the key.
#include <doctest.h>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "model/olmo3.h"
#include "tests/common/test_util.h"
#include "train/batch_source.h"
#include "train/config.h"
#include "train/step_list.h"
#include "train/eval.h"
#include "train/memory_model.h"

using namespace olmoref;

namespace {
std::string root() { return OLMOREF_TEST_SOURCE_ROOT; }

std::string error_of(const std::string& text, const std::vector<std::string>& ov = {}) {
  try {
    parse_config_text(text, "test.toml", ov);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const char* kValid = R"(
[model]
vocab_size = 64
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden = 64
swa_pattern = [8, -1]
[train]
seq_len = 16
micro_batch_instances = 2
global_batch_instances = 4
)";
}  // namespace

TEST_CASE("shipped configs parse, validate and report the published sizes") {
  const TrainConfig c7 = load_config(root() + "/configs/olmo3-7b.toml");
  CHECK(c7.model.n_params() == 7298617344LL);
  CHECK(c7.model.ffn_hidden == 11008);
  CHECK(c7.model.head_dim == 128);
  // ai2-olmo-core 3.0.0's num_flops_per_token (its own numbers: interop-olmo-core-counts); older releases, which
  // counted min(window, T) keys per query without the causal halving, gave 49.38 and 210.5.
  CHECK(c7.model.flops_per_token(8192) == 46558863360.0);
  const TrainConfig c32 = load_config(root() + "/configs/olmo3-32b.toml");
  CHECK(c32.model.n_params() == 32234279936LL);
  CHECK(c32.model.flops_per_token(8192) == 203406391296.0);
  const TrainConfig c14 = load_config(root() + "/configs/olmo3-14m.toml");
  CHECK(c14.model.n_params() == 26740864LL);
  CHECK(c14.model.ffn_hidden == 512);
  for (const char* name : {"tiny", "small", "parity"}) load_config(root() + "/configs/" + name + ".toml");
  // Stages 2 and 3 (OLMo-core's midtrain and long-context scripts): the same model; 2M-token batches to 100B tokens,
  // then 65,536-token instances with YaRN on the 8 full-attention layers only.
  const TrainConfig mid = load_config(root() + "/configs/olmo3-7b-midtrain.toml");
  CHECK(mid.model.n_params() == c7.model.n_params());
  CHECK(mid.train.global_batch_instances * mid.train.seq_len == 2097152);
  CHECK(mid.schedule.kind == "linear_with_warmup");
  CHECK(mid.schedule.alpha_f == 0.0);
  const TrainConfig lc = load_config(root() + "/configs/olmo3-7b-long-context.toml");
  CHECK(lc.model.n_params() == c7.model.n_params());
  CHECK(lc.train.seq_len == 65536);
  CHECK(lc.train.global_batch_instances * lc.train.seq_len == 4194304);
  int scaled = 0;
  for (int64_t l = 0; l < lc.model.n_layers; ++l) scaled += lc.model.rope_scaled(l);
  CHECK(scaled == 8);
  CHECK(lc.model.rope_scaling.factor == 8.0);
  CHECK(lc.data.document_masking);  // OLMo-core's generate_doc_lengths, at the dolma2 EOS
  CHECK(lc.data.eos_id == 100257);
  CHECK(lc.train.cp_degree == 8);  // TransformerContextParallelConfig.llama3(degree=8)
  // The 32B long-context script: 128 instances of 65,536 tokens, 100B tokens, YaRN on the 16 full-attention layers.
  const TrainConfig lc32 = load_config(root() + "/configs/olmo3-32b-long-context.toml");
  CHECK(lc32.model.n_params() == c32.model.n_params());
  CHECK(lc32.train.global_batch_instances * lc32.train.seq_len == 8388608);
  CHECK(lc32.train.steps == (100000000000LL + 8388607) / 8388608);
  CHECK(lc32.train.cp_degree == 8);
  CHECK(lc32.data.document_masking);
  scaled = 0;
  for (int64_t l = 0; l < lc32.model.n_layers; ++l) scaled += lc32.model.rope_scaled(l);
  CHECK(scaled == 16);
  // The real shapes recompute each block in backward (docs/memory.md).
  CHECK(c7.train.activation_checkpointing == "full");
  CHECK(c32.train.activation_checkpointing == "full");
}

TEST_CASE("train.cp_degree: written only when set, never in the resume hash, bad degrees refused naming the key") {
  const TrainConfig plain = parse_config_text(kValid, "t");
  CHECK(plain.train.cp_degree == 1);
  CHECK(plain.to_toml().find("cp_degree") == std::string::npos);
  const TrainConfig cp = parse_config_text(kValid, "t", {"train.cp_degree=2"});
  CHECK(cp.train.cp_degree == 2);
  CHECK(cp.to_toml().find("cp_degree = 2") != std::string::npos);
  CHECK(cp.resume_hash() == plain.resume_hash());  // a checkpoint resumes at any degree
  CHECK(cp.model_hash() == plain.model_hash());
  const int64_t T = plain.train.seq_len;
  const auto refused = [](const std::vector<std::string>& set, const std::string& want) {
    try {
      parse_config_text(kValid, "run.toml", set);
      FAIL("accepted " << set.back());
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find("run.toml") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find("train.cp_degree") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find(want) != std::string::npos, msg);
    }
  };
  refused({"train.cp_degree=0"}, ">= 1");
  refused({"train.cp_degree=" + std::to_string(T + 1)}, "does not divide train.seq_len");
}

TEST_CASE("train.activation_checkpointing takes none, full or selected_blocks with its interval; anything else names "
          "the key and the values") {
  CHECK(parse_config_text(kValid, "t").train.activation_checkpointing == "none");
  CHECK(parse_config_text(kValid, "t", {"train.activation_checkpointing=full"}).train.activation_checkpointing == "full");
  const TrainConfig sel = parse_config_text(
      kValid, "t", {"train.activation_checkpointing=selected_blocks", "train.activation_checkpointing_block_interval=3"});
  CHECK(sel.train.activation_checkpointing == "selected_blocks");
  CHECK(sel.train.activation_checkpointing_block_interval == 3);
  // Written back when set (a resolved config reads as it was run), and not at all when not.
  CHECK(sel.to_toml().find("activation_checkpointing_block_interval = 3") != std::string::npos);
  CHECK(parse_config_text(kValid, "t").to_toml().find("activation_checkpointing") == std::string::npos);
  // OLMo-core's selection: blocks 0, n, 2n, ...
  const ActivationCheckpointing ac = parse_activation_checkpointing("selected_blocks", 3);
  CHECK(ac.recomputes(0));
  CHECK(!ac.recomputes(1));
  CHECK(!ac.recomputes(2));
  CHECK(ac.recomputes(3));
  CHECK(ac.recomputed_blocks(32) == 11);
  CHECK(ActivationCheckpointing::full().recomputed_blocks(32) == 32);
  CHECK(ActivationCheckpointing::none().recomputed_blocks(32) == 0);
  auto refused = [](const std::vector<std::string>& sets, const std::vector<std::string>& wants) {
    const std::string msg = error_of(kValid, sets);
    CHECK_MESSAGE(!msg.empty(), "accepted " << sets.front());
    CHECK_MESSAGE(msg.find("test.toml") != std::string::npos, msg);
    for (const std::string& want : wants) CHECK_MESSAGE(msg.find(want) != std::string::npos, msg);
  };
  refused({"train.activation_checkpointing=selected"},
          {"train.activation_checkpointing", "\"none\"", "\"full\"", "\"selected_blocks\""});
  refused({"train.activation_checkpointing=selected_blocks"},
          {"train.activation_checkpointing_block_interval", ">= 1"});
  refused({"train.activation_checkpointing=selected_blocks", "train.activation_checkpointing_block_interval=0"},
          {"train.activation_checkpointing_block_interval", ">= 1"});
  refused({"train.activation_checkpointing=full", "train.activation_checkpointing_block_interval=2"},
          {"train.activation_checkpointing_block_interval", "\"selected_blocks\" only"});
}

TEST_CASE("model.rope_scaling: YaRN on the full-attention layers, its keys refused without it, bad values named") {
  const TrainConfig plain = parse_config_text(kValid, "t");
  CHECK(!plain.model.rope_scaling.on());
  CHECK(plain.to_toml().find("rope_") == plain.to_toml().find("rope_theta"));  // no scaling key written when off
  const TrainConfig y = parse_config_text(kValid, "t", {"model.rope_scaling=yarn"});
  CHECK(y.model.rope_scaling.factor == 8.0);  // Olmo 3's stage 3: factor 8, beta 32 / 1, from 8192 tokens
  CHECK(y.model.rope_scaling.old_context_len == 8192);
  CHECK(y.model.rope_scaled(0) == false);  // sliding window 8
  CHECK(y.model.rope_scaled(1) == true);   // full attention
  CHECK(y.model.rope_scaling.attention_factor() == doctest::Approx(1.2079441541679836).epsilon(1e-15));
  const TrainConfig all = parse_config_text(kValid, "t", {"model.rope_scaling=yarn", "model.rope_scaling_full_attention_only=false"});
  CHECK(all.model.rope_scaled(0) == true);
  CHECK(error_of(kValid, {"model.rope_yarn_factor=4.0"}).find("model.rope_scaling is \"none\"") != std::string::npos);
  CHECK(error_of(kValid, {"model.rope_scaling=ntk"}).find("model.rope_scaling") != std::string::npos);
  CHECK(error_of(kValid, {"model.rope_scaling=yarn", "model.rope_yarn_factor=0.5"}).find("model.rope_yarn_factor") !=
        std::string::npos);
  CHECK(error_of(kValid, {"model.rope_scaling=yarn", "model.rope_yarn_beta_fast=1"}).find("model.rope_yarn_beta_fast") !=
        std::string::npos);
}

TEST_CASE("sliding-window pattern: [w, w, w, full], last layer always full") {
  const TrainConfig c7 = load_config(root() + "/configs/olmo3-7b.toml");
  int full = 0;
  for (int64_t l = 0; l < c7.model.n_layers; ++l) full += c7.model.window(l) == 0;
  CHECK(full == 8);
  CHECK(c7.model.window(0) == 4096);
  CHECK(c7.model.window(3) == 0);
  CHECK(c7.model.window(31) == 0);
  const TrainConfig odd = parse_config_text(kValid, "t", {"model.n_layers=3", "model.swa_pattern=[8]"});
  CHECK(odd.model.window(0) == 8);
  CHECK(odd.model.window(1) == 8);
  CHECK(odd.model.window(2) == 0);  // forced full on the last layer
}

TEST_CASE("overrides use TOML syntax and are validated like file values") {
  const TrainConfig c = parse_config_text(kValid, "t", {"optim.lr=1e-2", "model.name=foo", "data.train_files=[\"a\", \"b\"]"});
  CHECK(c.optim.lr == 1e-2);
  CHECK(c.model.name == "foo");
  CHECK(c.data.train_files == std::vector<std::string>{"a", "b"});
  CHECK(error_of(kValid, {"optim.lr"}).find("section.key=value") != std::string::npos);
  CHECK(error_of(kValid, {"optim.lrr=1"}).find("'optim.lrr'") != std::string::npos);
}

TEST_CASE("invalid configs get an error naming the key") {
  auto with = [](const std::string& key, const std::string& value) { return error_of(kValid, {key + "=" + value}); };
  CHECK(with("model.n_heads", "5").find("model.d_model") != std::string::npos);   // 32 % 5 != 0
  CHECK(with("model.n_kv_heads", "3").find("model.n_kv_heads") != std::string::npos);
  CHECK(with("model.swa_pattern", "[0, -1]").find("model.swa_pattern") != std::string::npos);
  CHECK(with("model.swa_pattern", "[-5]").find("model.swa_pattern") != std::string::npos);
  CHECK(with("model.d_model", "\"big\"").find("model.d_model") != std::string::npos);
  CHECK(with("train.global_batch_instances", "0").find("train.global_batch_instances") != std::string::npos);
  CHECK(with("train.micro_batch_instances", "0").find("train.micro_batch_instances") != std::string::npos);
  CHECK(with("train.global_batch_instances", "5") == "");  // any micro-batch size: the last one is shorter
  CHECK(with("train.seq_len", "1").find("train.seq_len") != std::string::npos);
  CHECK(with("optim.beta2", "1.5").find("optim.beta2") != std::string::npos);
  CHECK(with("schedule.kind", "\"linear\"").find("schedule.kind") != std::string::npos);
  CHECK(with("model.head_dim", "7").find("model.head_dim") != std::string::npos);
  CHECK(error_of(std::string(kValid) + "\n[model2]\nx = 1\n").find("model2") != std::string::npos);
  CHECK(error_of(std::string(kValid) + "\n[optim]\nlearning_rate = 1\n").find("'optim.learning_rate'") != std::string::npos);
  const std::string syntax = error_of("[model\nvocab_size = 1");
  CHECK(syntax.find("test.toml") != std::string::npos);
  CHECK(syntax.find("line") != std::string::npos);
  CHECK(error_of(kValid).empty());
}

TEST_CASE("missing config file names the path") {
  try {
    load_config("/nonexistent/x.toml");
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("/nonexistent/x.toml") != std::string::npos);
  }
}

TEST_CASE("to_toml round-trips the resolved configuration") {
  const TrainConfig a = load_config(root() + "/configs/tiny.toml");
  const TrainConfig b = parse_config_text(a.to_toml(), "resolved");
  CHECK(b.to_toml() == a.to_toml());
  CHECK(b.model.n_params() == a.model.n_params());
}

TEST_CASE("every key of the table round-trips; the resume hash sees only what shapes the numbers") {
  const std::string tiny = root() + "/configs/tiny.toml";
  // Every key written only when set, set: each must come back from the resolved TOML as it went in.
  const std::vector<std::string> all_set = {
      "model.moe_experts=4", "model.moe_top_k=2", "model.moe_hidden=64", "model.moe_shared_hidden=32",
      "model.moe_lb_loss_weight=0.01", "model.moe_z_loss_weight=0.001", "model.moe_scale_loss_by_num_layers=false",
      "model.moe_normalize_expert_weights=1.0", "model.moe_lb_granularity=local_batch",
      "optim.kind=skip_step_adamw", "optim.rolling_interval_length=64", "optim.sigma_factor=3.0",
      "optim.step_increment_bugfix=false",
      "optim.group_overrides=[{params=[\"embeddings.weight\"],opts={weight_decay=0.0,lr=1e-4}}]",
      "schedule.kind=wsd", "schedule.units=tokens", "schedule.warmup=0", "schedule.warmup_fraction=0.1",
      "schedule.warmup_min_lr=1e-6", "schedule.decay=100", "schedule.decay_min_lr=1e-7",
      "data.max_target_sequence_length=256", "data.mix_base_dir=/corpus", "data.mix_tokenizer=dolma2",
      "data.pad_id=1", "data.bos_id=2", "data.olmo_core_state=/ckpt/step10", "data.audit=true",
      "data.eos_id=511", "data.document_masking=true",
      "train.activation_checkpointing=full", "model.rope_scaling=yarn", "model.rope_yarn_factor=4.0",
      "model.rope_yarn_beta_fast=16", "model.rope_yarn_beta_slow=2", "model.rope_yarn_old_context_len=64",
      "model.rope_scaling_full_attention_only=false", "init.hf_dir=/hf", "init.hf_sha256=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"};
  const TrainConfig a = load_config(tiny, all_set);
  const TrainConfig b = parse_config_text(a.to_toml(), "resolved");
  CHECK(b.to_toml() == a.to_toml());
  CHECK(b.resume_hash() == a.resume_hash());
  CHECK(b.model_hash() == a.model_hash());
  for (const char* key : {"rope_scaling = 'yarn'", "rope_yarn_old_context_len = 64", "rope_scaling_full_attention_only = false", "moe_lb_granularity = 'local_batch'", "group_overrides", "activation_checkpointing = 'full'", "decay = 100", "pad_id = 1",
                          "olmo_core_state", "hf_sha256", "step_increment_bugfix = false", "document_masking = true"})
    CHECK_MESSAGE(a.to_toml().find(key) != std::string::npos, key);

  // The values published before the key table: traces and checkpoints carry them.
  const TrainConfig base = load_config(tiny);
  CHECK(base.model_hash() == "22dac2a576dc3094");
  CHECK(base.resume_hash() == "9023839de8696e09");
  // Paths, logging, checkpointing, micro-batch size, executor, the model's name and [eval] never change a bit.
  const TrainConfig neutral = load_config(
      tiny, {"data.audit=true", "checkpoint.interval=7", "checkpoint.keep_last=1", "train.log_every=5",
             "train.micro_batch_instances=1", "train.executor=cuda-host", "model.name=other",
             "data.mix_base_dir=/elsewhere", "data.pad_id=3", "data.holdout_files=[\"h.npy\"]", "eval.interval=5",
             "eval.fresh_files=[\"f.npy\"]", "eval.alpha=0.05", "init.hf_dir=/hf",
             "train.activation_checkpointing=full"});
  CHECK(neutral.resume_hash() == base.resume_hash());
  // Left at its default it is not written: the resolved text of every config without it is what it was.
  CHECK(load_config(tiny, {"train.activation_checkpointing=none"}).to_toml() == base.to_toml());
  for (const char* shaping : {"optim.lr=1e-2", "data.seed=7", "schedule.warmup=3", "train.precision=bf16", "model.rope_scaling=yarn"})
    CHECK_MESSAGE(load_config(tiny, {shaping}).resume_hash() != base.resume_hash(), shaping);
  // Intra-document masking shapes the numbers; off (the default) it is not written.
  CHECK(base.to_toml().find("document_masking") == std::string::npos);
  CHECK(load_config(tiny, {"data.eos_id=511", "data.document_masking=true"}).resume_hash() !=
        load_config(tiny, {"data.eos_id=511"}).resume_hash());
}

TEST_CASE("[init] checkpoint: the source's checksum and load_optimizer are hashed, its path is not; exclusive with hf_dir") {
  const std::string tiny = root() + "/configs/tiny.toml";
  const TrainConfig base = load_config(tiny);
  CHECK(base.to_toml().find("[init]") == std::string::npos);  // runs without it keep their text and hashes
  const std::string x1 = "init.checkpoint_xxh3=\"0123456789abcdef\"", x2 = "init.checkpoint_xxh3=\"fedcba9876543210\"";
  const TrainConfig a = load_config(tiny, {"init.checkpoint=\"/s1/step10\"", x1});
  const TrainConfig moved = load_config(tiny, {"init.checkpoint=\"/elsewhere/step10\"", x1});
  const TrainConfig other = load_config(tiny, {"init.checkpoint=\"/s1/step10\"", x2});
  const TrainConfig weights_only = load_config(tiny, {"init.checkpoint=\"/s1/step10\"", x1, "init.load_optimizer=false"});
  CHECK(a.init.load_optimizer);
  CHECK(a.resume_hash() != base.resume_hash());
  CHECK(moved.resume_hash() == a.resume_hash());
  CHECK(other.resume_hash() != a.resume_hash());
  CHECK(weights_only.resume_hash() != a.resume_hash());
  CHECK(a.model_hash() == base.model_hash());
  const TrainConfig back = parse_config_text(weights_only.to_toml(), "resolved");
  CHECK(back.to_toml() == weights_only.to_toml());
  CHECK(back.init.checkpoint == "/s1/step10");
  CHECK(!back.init.load_optimizer);
  auto error = [&](const std::vector<std::string>& ov) {
    try {
      load_config(tiny, ov);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string both = error({"init.checkpoint=\"/s1/step10\"", "init.hf_dir=\"/hf\""});
  CHECK(both.find("'init.checkpoint'") != std::string::npos);
  CHECK(both.find("init.hf_dir") != std::string::npos);
  CHECK(error({"init.checkpoint_xxh3=\"xyz\""}).find("'init.checkpoint_xxh3'") != std::string::npos);
  CHECK(error({"init.load_optimizer=false"}).find("'init.load_optimizer'") != std::string::npos);
}

namespace {
// A scratch directory for the data-separation tests (removed at the end).
struct Scratch : testing::TempDir {
  Scratch() : TempDir("config-test") {}
  // uint16 tokens below the test vocabulary (64): value (seed + 7i) % 60.
  std::string tokens(const std::string& name, int n, int seed) const {
    std::ofstream out(file(name), std::ios::binary);
    for (int i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint16_t>((seed + 7 * i) % 60);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
    return file(name);
  }
};

std::string toml_list(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s + "]";
}

// What building the run's loader says (the trainer, resume-check and golden export all build it this way).
std::string loader_error(const std::vector<std::string>& ov) {
  try {
    const TrainConfig c = parse_config_text(kValid, "run.toml", ov);
    make_batch_source(c);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a holdout file that is also a training file is refused: by path, symlink, and by content") {
  Scratch s;
  const std::string a = s.tokens("a.u16", 400, 1), b = s.tokens("b.u16", 400, 2), h = s.tokens("h.u16", 300, 3);
  auto train_holdout = [](const std::vector<std::string>& tr, const std::vector<std::string>& ho) {
    return std::vector<std::string>{"data.train_files=" + toml_list(tr), "data.holdout_files=" + toml_list(ho)};
  };
  CHECK(loader_error(train_holdout({a, b}, {h})).empty());  // separate files: fine

  // The same path, the same file through "./" and "..", and through a symlink.
  const std::string same = loader_error(train_holdout({a, b}, {h, b}));
  CHECK(same.find("run.toml: ") == 0);
  CHECK(same.find("data.holdout_files entry 2 ('" + b + "')") != std::string::npos);
  CHECK(same.find("data.train_files entry 2 ('" + b + "')") != std::string::npos);
  CHECK(same.find("the same file") != std::string::npos);
  CHECK(same.find("remove it from the training data or from the holdout") != std::string::npos);
  const std::string dotted = s.path.string() + "/./sub/../b.u16";
  std::filesystem::create_directory(s.file("sub"));
  CHECK(loader_error(train_holdout({a, b}, {dotted})).find("the same file") != std::string::npos);
  std::filesystem::create_symlink(b, s.file("link.u16"));
  CHECK(loader_error(train_holdout({a, s.file("link.u16")}, {b})).find("the same file") != std::string::npos);

  // The same bytes under another name; the same size with other bytes is fine.
  std::filesystem::copy_file(a, s.file("copy.u16"));
  const std::string copy = loader_error(train_holdout({a, b}, {s.file("copy.u16")}));
  CHECK(copy.find("data.holdout_files entry 1 ('" + s.file("copy.u16") + "')") != std::string::npos);
  CHECK(copy.find("data.train_files entry 1 ('" + a + "')") != std::string::npos);
  CHECK(copy.find("the same bytes") != std::string::npos);
  s.tokens("other.u16", 400, 5);
  CHECK(loader_error(train_holdout({a, b}, {s.file("other.u16")})).empty());

  // Mixes: the entry is named by the mix file and its line.
  {
    std::ofstream m(s.file("train.mix"));
    m << "# training\nweb,a.u16\ncode,b.u16\n";
    std::ofstream hm(s.file("holdout.mix"));
    hm << "h.u16\n\nheld,copy.u16\n";
  }
  const std::string mixes = loader_error({"data.train_mix=\"" + s.file("train.mix") + "\"",
                                          "data.holdout_mix=\"" + s.file("holdout.mix") + "\""});
  CHECK(mixes.find("data.holdout_mix (" + s.file("holdout.mix") + " line 3") != std::string::npos);
  CHECK(mixes.find("data.train_mix (" + s.file("train.mix") + " line 2") != std::string::npos);

  // The sealed fresh split of [eval] is evaluation data too.
  const std::string fresh = loader_error({"data.train_files=" + toml_list({a, b}), "data.holdout_files=" + toml_list({h}),
                                          "eval.interval=5", "eval.fresh_files=" + toml_list({b})});
  CHECK(fresh.find("eval.fresh_files entry 1 ('" + b + "')") != std::string::npos);
  CHECK(fresh.find("data.train_files entry 2") != std::string::npos);
  // With [eval] off the fresh split is never read: a config may keep naming files that do not exist here.
  CHECK(loader_error({"data.train_files=" + toml_list({a, b}), "data.holdout_files=" + toml_list({h}),
                      "eval.interval=0", "eval.fresh_mix=\"" + s.file("absent.mix") + "\""}).empty());
}

TEST_CASE("errors about a config found after it was read still name its file") {
  // A mixture of experts in bf16: refused by validation, not first by the model (which never knew the file).
  const std::string moe = error_of(kValid, {"model.moe_experts=4", "model.moe_top_k=2", "model.moe_hidden=32",
                                            "train.precision=\"bf16\""});
  CHECK(moe.find("test.toml: config key 'train.precision'") == 0);
  CHECK(error_of(kValid, {"model.moe_experts=4", "model.moe_top_k=2", "model.moe_hidden=32"}).empty());
  // No training data at all.
  CHECK(loader_error({}).find("run.toml: config key 'data.train_files'") == 0);
  // The in-loop backstop with a holdout or fresh split too small to sample.
  Scratch s;
  const std::string tr = s.tokens("t.u16", 400, 1), h = s.tokens("h.u16", 20, 2), f = s.tokens("f.u16", 400, 3);
  try {
    Evaluator ev(parse_config_text(kValid, "run.toml",
                                   {"data.train_files=" + toml_list({tr}), "data.holdout_files=" + toml_list({h}),
                                    "eval.interval=5", "eval.fresh_files=" + toml_list({f})}));
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("run.toml: config key 'eval.instances'") == 0);
  }
}

TEST_CASE("the memory model: recompute, ranks and the alternatives it offers come from the same function") {
  const TrainConfig c7 = load_config(root() + "/configs/olmo3-7b.toml");
  auto part = [](const RankMemory& m, const std::string& name) {
    for (const MemoryPart& p : m.parts)
      if (p.name == name) return p.bytes;
    return int64_t{0};
  };
  const MemoryPlacement gpu8{8, 1, 1, "cuda"};
  TrainConfig none = c7;
  none.train.activation_checkpointing = "none";
  const RankMemory full_8 = predict_rank_memory(c7, gpu8), none_8 = predict_rank_memory(none, gpu8);
  CHECK(full_8.device);
  // 32 blocks: none keeps 32 block sets, full the 32 inputs and one set.
  CHECK(part(none_8, "activations") > 10 * part(full_8, "activations"));
  CHECK(part(full_8, "gradient stack") == part(none_8, "gradient stack"));
  // The state and the owners' slots fall as 1/W: 9 slots of the optimizer range (512 instances fed in nodes of the
  // micro-batch's 2 make at most log2(256) + 1 pending). A rank's own slots hold one unit, the largest (the head,
  // V·d + d), two of them at micro-batch 2, whatever the layout: no full-length gradient.
  const RankMemory full_64 = predict_rank_memory(c7, {64, 1, 1, "cuda"});
  const int64_t n = c7.model.n_params();
  CHECK(part(full_64, "parameters") * 8 <= part(full_8, "parameters") + 65536 * 4 * 8);
  const int64_t head = c7.model.vocab_size * c7.model.d_model + c7.model.d_model;
  CHECK(part(full_8, "gradient stack") == 2 * head * 4);
  CHECK(part(full_64, "gradient stack") == part(full_8, "gradient stack"));
  for (const auto& [m, W] : {std::pair{&full_8, 8}, std::pair{&full_64, 64}}) {
    CHECK(part(*m, "owner tree slots") >= 9 * (n / W) * 4);
    CHECK(part(*m, "owner tree slots") <= 9 * (n / W + 65536) * 4);
  }
  CHECK(full_8.largest().name == "owner tree slots");
  // What would fit a budget between the two: the fewest blocks recomputed that fit (selected_blocks at the largest
  // block_interval whose peak is within it), named with its peak. Just above full's peak no selection fits (one
  // recomputed block fewer keeps a block's set): full.
  auto selected = [&](int64_t interval) {
    TrainConfig c = none;
    c.train.activation_checkpointing = "selected_blocks";
    c.train.activation_checkpointing_block_interval = interval;
    return predict_rank_memory(c, gpu8).peak();
  };
  // A budget that block_interval 4 (8 of 32 recomputed) fits with a MiB to spare.
  const int64_t budget = selected(4) + (1 << 20);
  int64_t named = 0;
  for (int64_t interval = 32; interval >= 2 && named == 0; --interval)
    if (selected(interval) <= budget) named = interval;
  REQUIRE(named == 4);
  CHECK(selected(named) > full_8.peak());
  CHECK(selected(named) < none_8.peak());
  const std::string fits = memory_alternatives(none, gpu8, budget);
  CHECK_MESSAGE(fits.find("train.activation_checkpointing=\"selected_blocks\" with "
                          "train.activation_checkpointing_block_interval=" + std::to_string(named) + " (recomputes ") !=
                    std::string::npos,
                fits);
  const std::string tight = memory_alternatives(none, gpu8, full_8.peak() + (1 << 20));
  CHECK_MESSAGE(tight.find("train.activation_checkpointing=\"full\"") != std::string::npos, tight);
  CHECK(tight.find("selected_blocks") == std::string::npos);
  CHECK(memory_alternatives(none, gpu8, 1 << 20).empty());  // 1 MiB: nothing does
  // Without the prefetch, under nccl, the next unit's buffer and the exchange's second send block leave the device
  // (the head, V·d + d, the largest unit, each; one subtree a micro-batch of 2): a budget just over that peak names
  // train --no-prefetch, and one under it does not.
  MemoryPlacement nccl8 = gpu8;
  nccl8.transport = "nccl";
  MemoryPlacement no_prefetch = nccl8;
  no_prefetch.prefetch = false;
  const int64_t with = predict_rank_memory(c7, nccl8).peak(), without = predict_rank_memory(c7, no_prefetch).peak();
  CHECK(with - without == 2 * head * 4);
  CHECK(memory_alternatives(c7, nccl8, without + (1 << 20)).find("train --no-prefetch") != std::string::npos);
  CHECK(memory_alternatives(c7, nccl8, without - (1 << 20)).find("train --no-prefetch") == std::string::npos);
}

TEST_CASE("step lists: the steps in the order given; a malformed item refused, naming the option and the item") {
  using olmoref::parse_step_list;
  CHECK(parse_step_list("4", "--at") == std::vector<int64_t>{4});
  CHECK(parse_step_list("8,4,-1", "--at") == std::vector<int64_t>{8, 4, -1});  // ranges are the caller's
  for (const char* bad : {"", "4,", ",4", "4,,8", "4x", "x", "4.5", " 4"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_step_list(bad, "--at"), std::invalid_argument);
  }
  try {
    parse_step_list("1,5,z", "--states", "give steps like 1,5,10");
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "--states 1,5,z: 'z' is not a step; give steps like 1,5,10");
  }
}
