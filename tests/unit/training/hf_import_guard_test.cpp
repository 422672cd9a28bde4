// Import guards (issue 24): a NaN in one HF weight fails `convert_checkpoint import` naming the
// tensor and the file (nothing is saved); a config.json field of the wrong JSON type is an error
// naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/dist_checkpointing/safetensors.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

namespace fs = std::filesystem;
namespace st = dist_checkpointing;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "hf_models";
const std::string kConvert = std::string(MG_BIN_DIR) + "/convert_checkpoint";

fs::path copy_fixture(const std::string& model, const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_hf_guard_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  fs::copy(kFixtures / model, d, fs::copy_options::recursive);
  return d;
}

TEST(HfImportGuard, ANanWeightFailsTheImportNamingTheTensor) {
  const fs::path d = copy_fixture("gpt2", "nan");
  const fs::path file = d / "model.safetensors";
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
  const std::string poisoned = "transformer.h.1.mlp.c_fc.weight";
  {
    st::SafetensorsFile f(file.string());
    meta = f.metadata();
    for (const auto& n : f.names()) {
      Tensor t = f.tensor(n);
      if (n == poisoned) {
        auto v = t.to_vector<float>();
        v[v.size() / 2] = std::nanf("");
        t = Tensor::from_vector(v, t.shape()).to(t.dtype());
      }
      tensors.emplace_back(n, t);
    }
  }
  ASSERT_TRUE(std::any_of(tensors.begin(), tensors.end(),
                          [&](const auto& p) { return p.first == poisoned; }));
  fs::remove(file);
  st::save_safetensors(file.string(), tensors, meta);
  const fs::path out = d.parent_path() / "nan_ckpt";
  const auto r = test::run_command(kConvert + " import --hf-dir " + d.string() + " --save " +
                                   out.string() + " 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("HuggingFace tensor '" + poisoned + "' in '" + file.string() +
                          "' holds 1 NaN/inf value(s)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out / "latest_checkpointed_iteration.txt"));
}

TEST(HfImportGuard, AConfigFieldOfTheWrongTypeNamesTheKey) {
  const fs::path d = copy_fixture("llama", "types");
  nlohmann::json j;
  std::ifstream(d / "config.json") >> j;
  j["hidden_size"] = std::to_string(j["hidden_size"].get<int64_t>());
  std::ofstream(d / "config.json") << j.dump();
  const auto r = test::run_command(kConvert + " import --hf-dir " + d.string() + " --save " +
                                   (d.parent_path() / "types_ckpt").string() + " 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"hidden_size\" is \""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expected an integer"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mg
