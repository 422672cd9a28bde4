// HuggingFace import/export (tools/convert_checkpoint.cpp) against real transformers models
// (tests/fixtures/hf_models: LLaMA with GQA and an untied head, Qwen2 with qkv bias, tied, saved
// sharded with an index, GPT-2 with Conv1D weights, tied, Mistral with head dim x heads != hidden):
// import, rebuild the model from the
// checkpoint's recorded flags (training/checkpoint_model.h), run our CPU forward on the fixture's
// token ids and compare with the logits transformers computed (f32); export and compare every
// tensor with the original bit for bit (names, dtypes, shapes, bytes; padding rows dropped).
// Also: the flags file, --tp validation, and clear errors for unsupported or broken inputs.
// Issue 19: Llama 3 (llama3 RoPE scaling), Qwen2 with YaRN, Qwen3, Mixtral, Qwen2-MoE and
// Qwen3-MoE round-trip too, their greedy generation equals transformers', and a fine-tune keeps
// the HF identity (family, config.json, tokenizer files).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/training/checkpoint_model.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;
namespace st = dist_checkpointing;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "hf_models";
const std::string kConvert = std::string(MG_BIN_DIR) + "/convert_checkpoint";

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_hf_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// Runs a command; returns its exit status and its stdout+stderr.
int run(const std::string& cmd, std::string* out = nullptr) {
  const std::string log = temp_dir("cmdlog") + "/out.txt";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream s;
  s << f.rdbuf();
  if (out) *out = s.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Every tensor of an HF directory: name -> (file, entry).
struct HfDir {
  std::vector<std::unique_ptr<st::SafetensorsFile>> files;
  std::map<std::string, const st::SafetensorsFile*> by_name;
  explicit HfDir(const fs::path& d) {
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model", 0) != 0 || e.path().extension() != ".safetensors") continue;
      files.push_back(std::make_unique<st::SafetensorsFile>(e.path().string()));
      for (const auto& t : files.back()->names()) by_name[t] = files.back().get();
    }
  }
};

class HfRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(HfRoundTrip, ImportMatchesTransformersLogitsAndExportIsBitExact) {
  const std::string model = GetParam();
  const fs::path src = kFixtures / model;
  const std::string ckpt = temp_dir(model + "_ckpt"), out = temp_dir(model + "_out");
  std::string log;
  ASSERT_EQ(run(kConvert + " import --hf-dir " + src.string() + " --save " + ckpt, &log), 0) << log;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "model_args.yaml"));

  // Our forward on the fixture's ids vs transformers' logits.
  test::ensure_runtime();
  CheckpointModel cm = load_model_from_checkpoint(ckpt, test::ops_on("cpu"), Device::cpu());
  st::SafetensorsFile ref((src / "reference_logits.safetensors").string());
  const Tensor ids = ref.tensor("input_ids");  // [B, S] i64
  const Tensor want = ref.tensor("logits");    // [B, S, V] f32
  const int64_t b = ids.size(0), s = ids.size(1), v = want.size(2);
  EXPECT_EQ(cm.model->vocab_size(), v);
  EXPECT_GT(cm.model->padded_vocab_size(), v) << "the fixture's vocab should need padding";
  models::GPTBatch batch;
  batch.tokens = ids;
  const std::vector<double> got = test::to_doubles(cm.model->logits(batch));  // [S, B, V_pad]
  const std::vector<double> exp = test::to_doubles(want);
  const int64_t vp = cm.model->padded_vocab_size();
  double worst = 0.0, scale = 0.0;
  for (double e : exp) scale = std::max(scale, std::abs(e));
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t k = 0; k < v; ++k)
        worst = std::max(worst, std::abs(got[(j * b + i) * vp + k] - exp[(i * s + j) * v + k]));
  std::cout << model << ": max |logit - transformers| = " << worst << " (max |logit| " << scale
            << ")\n";
  EXPECT_LT(worst, 1e-5 * std::max(1.0, scale)) << model;

  // Export and compare every tensor bit for bit.
  ASSERT_EQ(run(kConvert + " export --load " + ckpt + " --hf-dir " + out, &log), 0) << log;
  HfDir a(src), e(out);
  ASSERT_FALSE(a.by_name.empty());
  std::vector<std::string> names_a, names_e;
  for (const auto& [n, f] : a.by_name) names_a.push_back(n);
  for (const auto& [n, f] : e.by_name) names_e.push_back(n);
  EXPECT_EQ(names_e, names_a);
  for (const auto& [n, f] : a.by_name) {
    auto it = e.by_name.find(n);
    if (it == e.by_name.end()) continue;
    const auto& ea = f->entry(n);
    const auto& ee = it->second->entry(n);
    EXPECT_EQ(ee.dtype, ea.dtype) << n;
    EXPECT_EQ(ee.shape, ea.shape) << n;
    const auto ba = f->bytes(n), be = it->second->bytes(n);
    ASSERT_EQ(ba.size(), be.size()) << n;
    EXPECT_EQ(std::memcmp(ba.data(), be.data(), ba.size()), 0) << n << " differs";
  }
  std::ifstream cf(fs::path(out) / "config.json");
  const auto cfg = nlohmann::json::parse(cf);
  std::ifstream of(src / "config.json");
  const auto orig = nlohmann::json::parse(of);
  EXPECT_EQ(cfg.at("model_type"), orig.at("model_type"));
  EXPECT_EQ(cfg.at("vocab_size"), orig.at("vocab_size"));
}

INSTANTIATE_TEST_SUITE_P(Models, HfRoundTrip,
                         ::testing::Values("llama", "qwen2", "gpt2", "mistral", "llama3",
                                           "qwen2_yarn", "qwen3", "mixtral", "qwen2_moe",
                                           "qwen3_moe"));

// Greedy generation with the KV cache from the imported checkpoint equals transformers'
// generate(do_sample=False) (generation.json); for llama3 / qwen2_yarn the prompt + generation
// (40 tokens) runs past the original context of 16.
class HfGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGreedy, GenerationEqualsTransformers) {
  const std::string model = GetParam();
  const fs::path src = kFixtures / model;
  const std::string ckpt = temp_dir(model + "_gen_ckpt");
  std::string log;
  ASSERT_EQ(run(kConvert + " import --hf-dir " + src.string() + " --save " + ckpt, &log), 0) << log;
  std::ifstream gf(src / "generation.json");
  const auto g = nlohmann::json::parse(gf);
  const auto prompt = g.at("prompt").get<std::vector<int32_t>>();
  const auto want = g.at("generated").get<std::vector<int32_t>>();
  test::ensure_runtime();
  CheckpointModel cm = load_model_from_checkpoint(ckpt, test::ops_on("cpu"), Device::cpu());
  inference::GenerationOptions go;
  go.sampling.greedy = true;
  go.max_new_tokens = static_cast<int64_t>(want.size());
  go.sample_vocab = cm.model->vocab_size();  // not the padding rows
  const inference::GenerationResult r = inference::generate(*cm.model, prompt, go);
  EXPECT_EQ(r.tokens, want) << model;
  if (model == "llama3" || model == "qwen2_yarn") {
    const auto rs = cm.model->config().rope_scaling;
    EXPECT_LT(rs.original_max_position_embeddings,
              static_cast<int64_t>(prompt.size() + want.size()))
        << "the generation should pass the original context";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfGreedy,
                         ::testing::Values("llama3", "qwen2_yarn", "qwen3", "mixtral", "qwen2_moe",
                                           "qwen3_moe"));

// The imported RoPE scaling and MoE settings become Megatron's flags in model_args.yaml.
TEST(HfImport, FlagsOfScaledAndMoeModels) {
  auto yaml = [](const std::string& model) {
    const std::string c = temp_dir(model + "_flags");
    std::string log;
    EXPECT_EQ(run(kConvert + " import --hf-model-path " + (kFixtures / model).string() +
                      " --output-path " + c + (model == "mixtral" ? " --tp 2 --ep 2" : ""),
                  &log),
              0)
        << log;
    std::ifstream y(fs::path(c) / "model_args.yaml");
    std::stringstream ys;
    ys << y.rdbuf();
    return ys.str();
  };
  const std::string l3 = yaml("llama3");
  for (const char* want : {"use-rope-scaling: true", "rope-scaling-factor: 4",
                           "rope-scaling-original-max-position-embeddings: 16"})
    EXPECT_NE(l3.find(want), std::string::npos) << want << "\n" << l3;
  const std::string yarn = yaml("qwen2_yarn");
  for (const char* want : {"position-embedding-type: yarn", "yarn-rotary-scaling-factor: 4",
                           "yarn-original-max-position-embeddings: 16"})
    EXPECT_NE(yarn.find(want), std::string::npos) << want << "\n" << yarn;
  const std::string mx = yaml("mixtral");
  for (const char* want : {"num-experts: 4", "moe-router-topk: 2", "expert-model-parallel-size: 2",
                           "tensor-model-parallel-size: 2", "sequence-parallel: true"})
    EXPECT_NE(mx.find(want), std::string::npos) << want << "\n" << mx;
  EXPECT_EQ(mx.find("moe-router-pre-softmax"), std::string::npos) << mx;
  const std::string q2 = yaml("qwen2_moe");
  for (const char* want : {"moe-router-pre-softmax: true", "moe-shared-expert-gate: true",
                           "moe-shared-expert-intermediate-size: 48", "add-qkv-bias: true"})
    EXPECT_NE(q2.find(want), std::string::npos) << want << "\n" << q2;
  const std::string q3 = yaml("qwen3");
  for (const char* want : {"qk-layernorm: true", "kv-channels: 16"})
    EXPECT_NE(q3.find(want), std::string::npos) << want << "\n" << q3;
  std::string log;
  EXPECT_NE(run(kConvert + " import --hf-dir " + (kFixtures / "mixtral").string() + " --save " +
                    temp_dir("ep3") + " --ep 3",
                &log),
            0);
  EXPECT_NE(log.find("--ep 3 must divide the number of experts (4)"), std::string::npos) << log;
}

// Item 3 of issue 19: a fine-tune of an imported model (pretrain_gpt --finetune, a few steps,
// saved) exports as the same family with the same config.json and the tokenizer files the import
// kept (text and binary), with trained (changed) weights under the same names.
TEST(HfImport, FinetuneKeepsTheHfIdentity) {
  const std::string src = temp_dir("id_src"), c = temp_dir("id_ckpt"), t = temp_dir("id_ft"),
                    out = temp_dir("id_out");
  fs::copy(kFixtures / "qwen3_moe", src, fs::copy_options::recursive);
  const fs::path tok = fs::path(MG_TEST_FIXTURES_DIR) / "hf_tokenizers";
  fs::copy(tok / "llama3_bytelevel" / "tokenizer.json", fs::path(src) / "tokenizer.json");
  fs::copy(tok / "llama3_bytelevel" / "tokenizer_config.json",
           fs::path(src) / "tokenizer_config.json");
  fs::copy(tok / "spm_unigram.model", fs::path(src) / "tokenizer.model");  // binary
  std::string log;
  ASSERT_EQ(run(kConvert + " import --hf-dir " + src + " --save " + c, &log), 0) << log;
  const std::string pretrain = std::string(MG_BIN_DIR) + "/pretrain_gpt";
  ASSERT_EQ(run("OMP_NUM_THREADS=1 " + pretrain + " --yaml-cfg " + c + "/model_args.yaml --load " +
                    c + " --finetune --mock-data --micro-batch-size 2 --global-batch-size 2 " +
                    "--seq-length 16 --train-iters 2 --lr 1e-2 --eval-iters 0 --save " + t +
                    " --save-interval 2",
                &log),
            0)
      << log;
  ASSERT_EQ(run(kConvert + " export --checkpoint-path " + t + " --output-path " + out, &log), 0)
      << log;
  EXPECT_NE(log.find("exported qwen3_moe"), std::string::npos) << log;
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  EXPECT_EQ(nlohmann::json::parse(read(fs::path(out) / "config.json")),
            nlohmann::json::parse(read(fs::path(src) / "config.json")));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}) {
    ASSERT_TRUE(fs::exists(fs::path(out) / f)) << f;
    EXPECT_EQ(read(fs::path(out) / f), read(fs::path(src) / f)) << f << " differs";
  }
  HfDir a{fs::path(src)}, e{fs::path(out)};
  ASSERT_EQ(a.by_name.size(), e.by_name.size());
  int changed = 0;
  for (const auto& [n, f] : a.by_name) {
    ASSERT_TRUE(e.by_name.count(n)) << n;
    EXPECT_EQ(e.by_name[n]->entry(n).shape, f->entry(n).shape) << n;
    const auto ba = f->bytes(n), be = e.by_name[n]->bytes(n);
    changed += ba.size() != be.size() || std::memcmp(ba.data(), be.data(), ba.size()) != 0;
  }
  EXPECT_GT(changed, 0) << "the fine-tune changed no weight";
}

TEST(HfImport, ReimportOfTheExportGivesTheSameCheckpointTensors) {
  // Sharded export (small --max-shard-size) with its index, imported again: same parameters.
  const std::string c1 = temp_dir("re_c1"), h = temp_dir("re_h"), c2 = temp_dir("re_c2");
  std::string log;
  ASSERT_EQ(
      run(kConvert + " import --hf-dir " + (kFixtures / "llama").string() + " --save " + c1, &log),
      0)
      << log;
  ASSERT_EQ(
      run(kConvert + " export --load " + c1 + " --hf-dir " + h + " --max-shard-size 100KB", &log),
      0)
      << log;
  EXPECT_TRUE(fs::exists(fs::path(h) / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(fs::path(h) / "model.safetensors"));
  ASSERT_EQ(run(kConvert + " import --hf-dir " + h + " --save " + c2, &log), 0) << log;
  test::ensure_runtime();
  auto m1 = load_model_from_checkpoint(c1, test::ops_on("cpu"), Device::cpu());
  auto m2 = load_model_from_checkpoint(c2, test::ops_on("cpu"), Device::cpu());
  EXPECT_EQ(m1.model->buffer().params.to_vector<float>(),
            m2.model->buffer().params.to_vector<float>());
}

TEST(HfImport, Bf16ModelRoundTripsBitExact) {
  // The LLaMA fixture in bf16 (config "dtype": "bfloat16"): imported as a --bf16 model, exported
  // with the same bf16 bytes.
  const std::string src = temp_dir("bf16_src"), c = temp_dir("bf16_ckpt"),
                    out = temp_dir("bf16_out");
  {
    st::SafetensorsFile f((kFixtures / "llama" / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> t;
    for (const auto& n : f.names()) t.emplace_back(n, f.tensor(n).to(DType::bf16));
    st::save_safetensors((fs::path(src) / "model.safetensors").string(), t);
    std::ifstream cf(kFixtures / "llama" / "config.json");
    auto j = nlohmann::json::parse(cf);
    j["dtype"] = "bfloat16";
    std::ofstream(fs::path(src) / "config.json") << j.dump(2);
  }
  std::string log;
  ASSERT_EQ(run(kConvert + " import --hf-dir " + src + " --save " + c, &log), 0) << log;
  std::ifstream y(fs::path(c) / "model_args.yaml");
  std::stringstream ys;
  ys << y.rdbuf();
  EXPECT_NE(ys.str().find("bf16: true"), std::string::npos) << ys.str();
  ASSERT_EQ(run(kConvert + " export --load " + c + " --hf-dir " + out, &log), 0) << log;
  HfDir a{fs::path(src)}, e{fs::path(out)};
  ASSERT_EQ(a.by_name.size(), e.by_name.size());
  for (const auto& [n, f] : a.by_name) {
    ASSERT_TRUE(e.by_name.count(n)) << n;
    EXPECT_EQ(e.by_name[n]->entry(n).dtype, "BF16") << n;
    const auto ba = f->bytes(n), be = e.by_name[n]->bytes(n);
    ASSERT_EQ(ba.size(), be.size()) << n;
    EXPECT_EQ(std::memcmp(ba.data(), be.data(), ba.size()), 0) << n << " differs";
  }
}

TEST(HfImport, TpPpAreValidatedAndWrittenToTheFlagsFile) {
  const std::string c = temp_dir("tp_ok");
  std::string log;
  ASSERT_EQ(run(kConvert + " import --hf-dir " + (kFixtures / "llama").string() + " --save " + c +
                    " --tp 2 --pp 2",
                &log),
            0)
      << log;
  std::ifstream y(fs::path(c) / "model_args.yaml");
  std::stringstream ys;
  ys << y.rdbuf();
  EXPECT_NE(ys.str().find("tensor-model-parallel-size: 2"), std::string::npos) << ys.str();
  EXPECT_NE(ys.str().find("pipeline-model-parallel-size: 2"), std::string::npos) << ys.str();
  EXPECT_NE(ys.str().find("num-query-groups: 2"), std::string::npos) << ys.str();
  EXPECT_NE(run(kConvert + " import --hf-dir " + (kFixtures / "llama").string() + " --save " +
                    temp_dir("tp_bad") + " --tp 4",
                &log),
            0);
  EXPECT_NE(log.find("--tp 4 must divide"), std::string::npos) << log;
  EXPECT_NE(log.find("KV heads (2)"), std::string::npos) << log;
}

TEST(HfImport, ClearErrors) {
  std::string log;
  // An unsupported RoPE scaling is refused naming the type.
  const std::string d = temp_dir("scaled");
  fs::copy(kFixtures / "llama", d, fs::copy_options::recursive);
  {
    std::ifstream f(fs::path(d) / "config.json");
    auto j = nlohmann::json::parse(f);
    j["rope_parameters"]["rope_type"] = "dynamic";
    j["rope_parameters"]["factor"] = 2.0;
    std::ofstream(fs::path(d) / "config.json") << j.dump();
  }
  EXPECT_NE(run(kConvert + " import --hf-dir " + d + " --save " + temp_dir("x1"), &log), 0);
  EXPECT_NE(log.find("rope_type 'dynamic'"), std::string::npos) << log;
  // A shard named by the index is missing.
  const std::string q = temp_dir("noshard");
  fs::copy(kFixtures / "qwen2", q, fs::copy_options::recursive);
  fs::remove(fs::path(q) / "model-00002-of-00003.safetensors");
  EXPECT_NE(run(kConvert + " import --hf-dir " + q + " --save " + temp_dir("x2"), &log), 0);
  EXPECT_NE(log.find("model-00002-of-00003.safetensors"), std::string::npos) << log;
  EXPECT_NE(log.find("is missing"), std::string::npos) << log;
  // A truncated safetensors file.
  const std::string t = temp_dir("trunc");
  fs::copy(kFixtures / "gpt2", t, fs::copy_options::recursive);
  fs::resize_file(fs::path(t) / "model.safetensors",
                  fs::file_size(fs::path(t) / "model.safetensors") - 100);
  EXPECT_NE(run(kConvert + " import --hf-dir " + t + " --save " + temp_dir("x3"), &log), 0);
  EXPECT_NE(log.find("model.safetensors"), std::string::npos) << log;
  // An unsupported model type.
  const std::string u = temp_dir("unknown");
  std::ofstream(fs::path(u) / "config.json") << R"({"model_type": "t5"})";
  EXPECT_NE(run(kConvert + " import --hf-dir " + u + " --save " + temp_dir("x4"), &log), 0);
  EXPECT_NE(log.find("model_type 't5' is not supported"), std::string::npos) << log;
}

}  // namespace
}  // namespace mg::training
