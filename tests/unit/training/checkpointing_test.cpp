// Checkpoints: round trip of parameters, optimizer/scheduler state, RNG and data position; the
// tracker file; --no-save-optim; and the failure modes: a save killed at a random moment never
// looks complete and never hides the previous checkpoint; truncated or corrupt files, missing or
// extra tensors and wrong shapes give errors naming the file and tensor.
#include "megatron/training/checkpointing.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

struct Params {
  std::vector<transformer::Parameter> list;
};

Params make_params(double base, int64_t rows = 4) {
  Params p;
  auto add = [&](const std::string& name, Shape shape) {
    std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25 * static_cast<double>(i);
    transformer::Parameter prm;
    prm.name = name;
    prm.param = Tensor::from_vector(v, shape, DType::f32);
    prm.global_shape = shape;
    p.list.push_back(prm);
  };
  add("embedding.word_embeddings.weight", {rows, 8});
  add("decoder.layers.0.self_attention.linear_qkv.weight", {24, 8});
  add("decoder.final_layernorm.weight", {8});
  return p;
}

std::string temp_root(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_ckpt_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d.string();
}

CheckpointState make_state(int64_t iteration) {
  CheckpointState s;
  s.iteration = iteration;
  s.consumed_train_samples = iteration * 8;
  s.consumed_valid_samples = 16;
  s.floating_point_operations_so_far = 1.5e12;
  optimizer::StateDict o;
  o.tensors["optimizer.state.exp_avg.decoder.final_layernorm.weight"] =
      Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {8});
  o.numbers["step"] = static_cast<double>(iteration);
  o.numbers["grad_scaler.scale"] = 65536.0;
  o.strings["optimizer"] = "adam";
  s.optimizer = o;
  optimizer::StateDict sch;
  sch.numbers["num_steps"] = 123456789012.0;
  sch.numbers["max_lr"] = 3e-4;
  sch.strings["lr_decay_style"] = "cosine";
  s.scheduler = sch;
  s.rng = nlohmann::json{{"seed", 1234}};
  s.args = nlohmann::json{{"--num-layers", {"2"}}};
  return s;
}

TEST(Checkpointing, RoundTrip) {
  const auto root = temp_root("roundtrip");
  Params saved = make_params(1.0);
  save_checkpoint(root, saved.list, make_state(100));
  EXPECT_TRUE(fs::exists(root + "/iter_0000100/model.safetensors"));
  EXPECT_TRUE(fs::exists(root + "/iter_0000100/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(root + "/iter_0000100/metadata.json"));
  std::ifstream t(root + "/latest_checkpointed_iteration.txt");
  std::string tracker((std::istreambuf_iterator<char>(t)), {});
  EXPECT_EQ(tracker, "100");  // Megatron: str(iteration), no newline

  Params loaded = make_params(-5.0);
  CheckpointState st = load_checkpoint(root, loaded.list);
  for (std::size_t i = 0; i < saved.list.size(); ++i)
    EXPECT_EQ(loaded.list[i].param.to_vector<float>(), saved.list[i].param.to_vector<float>());
  EXPECT_EQ(st.iteration, 100);
  EXPECT_EQ(st.consumed_train_samples, 800);
  EXPECT_EQ(st.consumed_valid_samples, 16);
  EXPECT_EQ(st.floating_point_operations_so_far, 1.5e12);
  ASSERT_TRUE(st.optimizer && st.scheduler && st.rng);
  EXPECT_EQ(st.optimizer->number("step"), 100.0);
  EXPECT_EQ(st.optimizer->number("grad_scaler.scale"), 65536.0);
  EXPECT_EQ(st.optimizer->string("optimizer"), "adam");
  EXPECT_EQ(st.optimizer->tensor("optimizer.state.exp_avg.decoder.final_layernorm.weight")
                .to_vector<float>()[7],
            8.f);
  EXPECT_EQ(st.scheduler->number("num_steps"), 123456789012.0);  // exact counter
  EXPECT_EQ(st.scheduler->number("max_lr"), 3e-4);               // round-trip double
  EXPECT_EQ((*st.rng)["seed"], 1234);
  EXPECT_EQ(st.args["--num-layers"][0], "2");

  // Metadata records global shapes and dtypes.
  std::ifstream m(root + "/iter_0000100/metadata.json");
  auto meta = nlohmann::json::parse(m);
  EXPECT_EQ(meta["files"]["model.safetensors"]["embedding.word_embeddings.weight"]["global_shape"],
            nlohmann::json({4, 8}));

  // Load options: no optimizer, no rng.
  LoadOptions no_state;
  no_state.load_optimizer = false;
  no_state.load_rng = false;
  st = load_checkpoint(root, loaded.list, no_state);
  EXPECT_FALSE(st.optimizer || st.scheduler || st.rng);
}

TEST(Checkpointing, NoSaveOptimAndTrackerAdvances) {
  const auto root = temp_root("nooptim");
  Params p = make_params(1.0);
  CheckpointState s = make_state(5);
  s.optimizer.reset();
  s.scheduler.reset();
  s.rng.reset();
  save_checkpoint(root, p.list, s);
  EXPECT_FALSE(fs::exists(root + "/iter_0000005/optimizer.safetensors"));
  save_checkpoint(root, p.list, make_state(10));
  EXPECT_EQ(read_latest_iteration(root), 10);
  LoadOptions at5;
  at5.iteration = 5;
  CheckpointState st = load_checkpoint(root, p.list, at5);
  EXPECT_FALSE(st.optimizer.has_value());
  EXPECT_EQ(st.iteration, 5);
  // Re-saving the same iteration replaces it.
  save_checkpoint(root, make_params(2.0).list, make_state(10));
  Params q = make_params(0.0);
  load_checkpoint(root, q.list);
  EXPECT_EQ(q.list[0].param.to_vector<float>()[0], 2.f);
  EXPECT_FALSE(read_latest_iteration(temp_root("empty")).has_value());
}

TEST(Checkpointing, HalfWrittenSaveNeverLooksComplete) {
  const auto root = temp_root("crash");
  Params good = make_params(1.0);
  save_checkpoint(root, good.list, make_state(1));
  // Children save big checkpoints of iteration 2 and are killed at increasing moments.
  Params big = make_params(7.0, 200000);  // ~6 MB of embedding
  Params big_target = make_params(0.0, 200000);
  int completed = 0, killed = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        save_checkpoint(root, big.list, make_state(2));
      } catch (...) {
        _exit(2);
      }
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 * attempt * attempt));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
      ++killed;
    } else {
      ++completed;
    }
    // Whatever the tracker says must load completely.
    const auto it = read_latest_iteration(root);
    ASSERT_TRUE(it == 1 || it == 2) << "tracker " << (it ? *it : -1);
    Params fresh = *it == 1 ? make_params(0.0) : big_target;
    EXPECT_NO_THROW(load_checkpoint(root, fresh.list)) << "attempt " << attempt;
    // A final-named iteration directory is always complete.
    for (const auto& e : fs::directory_iterator(root)) {
      const auto name = e.path().filename().string();
      if (name.rfind("iter_", 0) == 0 && name.find(".tmp.") == std::string::npos &&
          name.find(".old.") == std::string::npos) {
        EXPECT_TRUE(fs::exists(e.path() / "metadata.json")) << name;
      }
    }
    fs::remove_all(root + "/iter_0000002");
    save_checkpoint(root, good.list, make_state(1));
  }
  EXPECT_GT(killed, 0) << "no save was interrupted; the test proves nothing";
}

TEST(Checkpointing, CorruptAndIncompleteCheckpointsGiveClearErrors) {
  const auto root = temp_root("corrupt");
  Params p = make_params(1.0);
  save_checkpoint(root, p.list, make_state(3));
  const std::string dir = root + "/iter_0000003";

  // Wrong shape / missing / extra tensors.
  Params bigger = make_params(0.0, 5);
  auto e = test::error_message([&] { load_checkpoint(root, bigger.list); });
  EXPECT_NE(e.find("tensor 'embedding.word_embeddings.weight' has shape [4, 8], the model has "
                   "[5, 8]"),
            std::string::npos)
      << e;
  Params more = make_params(0.0);
  more.list.push_back(more.list[2]);
  more.list.back().name = "output_layer.weight";
  e = test::error_message([&] { load_checkpoint(root, more.list); });
  EXPECT_NE(e.find("has no tensor 'output_layer.weight'"), std::string::npos) << e;
  Params fewer = make_params(0.0);
  fewer.list.pop_back();
  e = test::error_message([&] { load_checkpoint(root, fewer.list); });
  EXPECT_NE(e.find("has tensor 'decoder.final_layernorm.weight' that the model does not"),
            std::string::npos)
      << e;

  // Truncated model file.
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 7);
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("model.safetensors' is truncated"), std::string::npos) << e;

  // Corrupt metadata, missing metadata, bad tracker.
  { std::ofstream(dir + "/metadata.json") << "{\"format\": "; }
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("metadata.json' is corrupt"), std::string::npos) << e;
  fs::remove(dir + "/metadata.json");
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("is incomplete: metadata.json is missing"), std::string::npos) << e;
  { std::ofstream(root + "/latest_checkpointed_iteration.txt") << "abc"; }
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("holds 'abc'"), std::string::npos) << e;
  { std::ofstream(root + "/latest_checkpointed_iteration.txt") << "7\n"; }
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("iter_0000007' does not exist"), std::string::npos) << e;
  e = test::error_message([&] { load_checkpoint(temp_root("none"), p.list); });
  EXPECT_NE(e.find("latest_checkpointed_iteration.txt is missing"), std::string::npos) << e;
}

}  // namespace
}  // namespace mg::training
