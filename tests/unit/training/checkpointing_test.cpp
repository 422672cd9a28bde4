// Checkpoints: round trip of parameters, optimizer/scheduler state, RNG and data position in both
// formats (sharded, legacy); the tracker file; --no-save-optim; and the failure modes: a save
// killed at a random moment never looks complete and never hides the previous checkpoint;
// truncated, missing or corrupt files, missing or extra tensors, wrong shapes and dtypes give
// errors naming the file and tensor. Sharded format: a changed vocabulary padding, distributed-
// optimizer state stored per parameter (loadable with or without another range split), async
// save. (Multi-rank resharding: tests/unit/training/checkpoint_reshard.sh.)
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

class CheckpointingFormats : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointingFormats, RoundTrip) {
  const std::string format = GetParam();
  const auto root = temp_root("roundtrip_" + format);
  Params saved = make_params(1.0);
  SaveOptions so;
  so.format = format;
  save_checkpoint(root, saved.list, make_state(100), {}, so);
  if (format == "legacy") {
    EXPECT_TRUE(fs::exists(root + "/iter_0000100/model.safetensors"));
    EXPECT_TRUE(fs::exists(root + "/iter_0000100/optimizer.safetensors"));
  } else {
    EXPECT_TRUE(fs::exists(root + "/iter_0000100/rank_00000.safetensors"));
  }
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

  EXPECT_EQ(st.format, format);
  // Metadata records global shapes and dtypes.
  std::ifstream m(root + "/iter_0000100/metadata.json");
  auto meta = nlohmann::json::parse(m);
  if (format == "legacy") {
    EXPECT_EQ(
        meta["files"]["model.safetensors"]["embedding.word_embeddings.weight"]["global_shape"],
        nlohmann::json({4, 8}));
  } else {
    const auto& e = meta["index"]["embedding.word_embeddings.weight"];
    EXPECT_EQ(e["global_shape"], nlohmann::json({4, 8}));
    EXPECT_EQ(e["dtype"], "F32");
    ASSERT_EQ(e["pieces"].size(), 1u);
    EXPECT_EQ(e["pieces"][0]["file"], "rank_00000.safetensors");
    EXPECT_EQ(e["pieces"][0]["offset"], nlohmann::json({0, 0}));
    EXPECT_TRUE(meta["index"].contains("optimizer.state.exp_avg.decoder.final_layernorm.weight"));
    EXPECT_EQ(meta["rng_state_per_rank"], nlohmann::json::array({{{"seed", 1234}}}));
    // --ckpt-format legacy refuses it unless auto-detecting.
    LoadOptions strict;
    strict.format = "legacy";
    strict.auto_detect_format = false;
    const auto e2 = test::error_message([&] { load_checkpoint(root, loaded.list, strict); });
    EXPECT_NE(e2.find("is in the sharded format but this run has --ckpt-format legacy"),
              std::string::npos)
        << e2;
  }

  // Load options: no optimizer, no rng.
  LoadOptions no_state;
  no_state.load_optimizer = false;
  no_state.load_rng = false;
  st = load_checkpoint(root, loaded.list, no_state);
  EXPECT_FALSE(st.optimizer || st.scheduler || st.rng);
}

INSTANTIATE_TEST_SUITE_P(Both, CheckpointingFormats, ::testing::Values("sharded", "legacy"));

TEST(Checkpointing, NoSaveOptimAndTrackerAdvances) {
  const auto root = temp_root("nooptim");
  Params p = make_params(1.0);
  CheckpointState s = make_state(5);
  s.optimizer.reset();
  s.scheduler.reset();
  s.rng.reset();
  save_checkpoint(root, p.list, s);
  {
    std::ifstream m(root + "/iter_0000005/metadata.json");
    const auto meta = nlohmann::json::parse(m);
    EXPECT_FALSE(meta.contains("optimizer"));
    for (auto it = meta["index"].begin(); it != meta["index"].end(); ++it)
      EXPECT_EQ(it.key().rfind("optimizer.", 0), std::string::npos) << it.key();
  }
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

  // Truncated and missing shard files.
  const std::string shard = dir + "/rank_00000.safetensors";
  fs::copy_file(shard, dir + "/saved");
  fs::resize_file(shard, fs::file_size(shard) - 7);
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("rank_00000.safetensors' is truncated"), std::string::npos) << e;
  fs::remove(shard);
  e = test::error_message([&] { load_checkpoint(root, p.list); });
  EXPECT_NE(e.find("is missing shard file 'rank_00000.safetensors'"), std::string::npos) << e;
  fs::rename(dir + "/saved", shard);
  EXPECT_NO_THROW(load_checkpoint(root, p.list));

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

TEST(Checkpointing, DtypeShapeAndVocabularyPadding) {
  const auto root = temp_root("dtype");
  Params p = make_params(1.0);
  CheckpointState s = make_state(1);
  s.vocab_size = 3;  // 3 real rows of the 4-row embedding
  save_checkpoint(root, p.list, s);
  // A bf16 model refuses the f32 checkpoint, naming both.
  Params half = make_params(0.0);
  for (auto& prm : half.list) prm.param = prm.param.to(DType::bf16);
  auto e = test::error_message([&] { load_checkpoint(root, half.list); });
  EXPECT_NE(e.find("'embedding.word_embeddings.weight' is stored as F32, the run has BF16"),
            std::string::npos)
      << e;
  // A padded vocabulary of 8 rows loads the 3 real rows when both record vocab 3; the padding
  // rows keep their values.
  Params wide = make_params(-100.0, 8);
  e = test::error_message([&] { load_checkpoint(root, wide.list); });
  EXPECT_NE(e.find("has shape [4, 8], the model has [8, 8] (the vocabulary padding may change"),
            std::string::npos)
      << e;
  LoadOptions o;
  o.vocab_size = 3;
  const auto st = load_checkpoint(root, wide.list, o);
  EXPECT_EQ(st.vocab_size, 3);
  const auto got = wide.list[0].param.to_vector<float>();
  const auto want = p.list[0].param.to_vector<float>();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(got[i], want[i]) << i;
  for (int i = 24; i < 64; ++i) EXPECT_EQ(got[i], -100.0f + 0.25f * static_cast<float>(i)) << i;
  // Any other dim of another tensor still must match.
  Params other = make_params(0.0);
  other.list[1].param = Tensor::zeros({24, 4}, DType::f32);
  other.list[1].global_shape = {24, 4};
  e = test::error_message([&] { load_checkpoint(root, other.list, o); });
  EXPECT_NE(e.find("'decoder.layers.0.self_attention.linear_qkv.weight' has shape [24, 8], the "
                   "model has [24, 4] (a checkpoint of another model?)"),
            std::string::npos)
      << e;
}

// Parameters laid out in one flat buffer (offsets as ParamAndGradBuffer: reverse order).
Params buffered_params(double base) {
  Params p = make_params(base);
  int64_t off = 0;
  for (std::size_t i = p.list.size(); i-- > 0;) {
    p.list[i].buffer_offset = off;
    off += p.list[i].param.numel();
  }
  return p;
}
int64_t buffer_numel(const Params& p) {
  int64_t n = 0;
  for (const auto& prm : p.list) n += prm.param.numel();
  return n;
}
std::vector<float> flat_values(int64_t n, float base) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  return v;
}

TEST(Checkpointing, DistributedOptimizerStateIsStoredPerParameter) {
  // The distributed optimizer's flat shard (here one rank owning two ranges of the buffer) is
  // stored in parameter space: it loads as per-parameter state, and into another range split.
  const auto root = temp_root("zero");
  Params p = buffered_params(1.0);
  const int64_t n = buffer_numel(p);
  CheckpointState s = make_state(4);
  s.optimizer->tensors.clear();
  s.optimizer->tensors["optimizer.shard.exp_avg"] =
      Tensor::from_vector(flat_values(n, 0.f), {n}, DType::f32);
  s.optimizer->strings["shard.ranges"] = "0:13,13:" + std::to_string(n);
  s.optimizer->numbers["shard.rank"] = 0;
  s.optimizer->numbers["shard.size"] = 1;
  CheckpointRanks zero;
  zero.optimizer_sharded = true;
  save_checkpoint(root, p.list, s, zero);

  // Unsharded: each parameter's exp_avg is its slice of the flat buffer.
  Params q = buffered_params(0.0);
  auto st = load_checkpoint(root, q.list);
  ASSERT_TRUE(st.optimizer.has_value());
  EXPECT_FALSE(st.optimizer->has_string("shard.ranges"));
  for (const auto& prm : q.list) {
    const auto v = st.optimizer->tensor("optimizer.state.exp_avg." + prm.name).to_vector<float>();
    ASSERT_EQ(static_cast<int64_t>(v.size()), prm.param.numel());
    for (std::size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(v[i], static_cast<float>(prm.buffer_offset + static_cast<int64_t>(i)));
  }
  // Sharded differently: the template's ranges decide.
  LoadOptions o;
  optimizer::StateDict tmpl;
  tmpl.tensors["optimizer.shard.exp_avg"] = Tensor::zeros({n - 5}, DType::f32);
  tmpl.strings["shard.ranges"] = "5:40,40:" + std::to_string(n);
  tmpl.numbers["shard.rank"] = 0;
  tmpl.numbers["shard.size"] = 1;
  o.optimizer_template = tmpl;
  st = load_checkpoint(root, q.list, o, zero);
  EXPECT_EQ(st.optimizer->string("shard.ranges"), tmpl.strings["shard.ranges"]);
  const auto v = st.optimizer->tensor("optimizer.shard.exp_avg").to_vector<float>();
  ASSERT_EQ(static_cast<int64_t>(v.size()), n - 5);
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], static_cast<float>(i + 5)) << i;
  // Without a template the distributed optimizer cannot be filled.
  const auto e = test::error_message([&] { load_checkpoint(root, q.list, {}, zero); });
  EXPECT_NE(e.find("needs LoadOptions::optimizer_template"), std::string::npos) << e;
}

TEST(Checkpointing, AsyncSaveFinalisesOnTheNextSaveOrExplicitly) {
  const auto root = temp_root("async");
  Params p = make_params(1.0);
  save_checkpoint(root, p.list, make_state(1));
  SaveOptions async;
  async.async = true;
  AsyncCheckpointSaver saver;  // the caller's: no process-wide pending save
  Params later = make_params(3.0);
  const auto io = save_checkpoint(root, later.list, make_state(2), {}, async, &saver);
  EXPECT_TRUE(io.async);
  EXPECT_GT(io.total_bytes, 0.0);
  // The pieces were copied: changing the params now does not change what is written.
  for (auto& prm : later.list) prm.param.zero_();
  EXPECT_EQ(read_latest_iteration(root), 1);  // not final yet
  EXPECT_TRUE(saver.pending());
  EXPECT_TRUE(saver.finalize());
  EXPECT_FALSE(saver.finalize());
  EXPECT_EQ(read_latest_iteration(root), 2);
  Params q = make_params(0.0);
  load_checkpoint(root, q.list);
  EXPECT_EQ(q.list[0].param.to_vector<float>(), make_params(3.0).list[0].param.to_vector<float>());
  // A second async save is finalised by the next save.
  save_checkpoint(root, make_params(5.0).list, make_state(3), {}, async, &saver);
  save_checkpoint(root, make_params(6.0).list, make_state(4), {}, {}, &saver);
  EXPECT_FALSE(saver.pending());
  LoadOptions at3;
  at3.iteration = 3;
  load_checkpoint(root, q.list, at3);
  EXPECT_EQ(q.list[0].param.to_vector<float>()[0], 5.f);
  EXPECT_EQ(read_latest_iteration(root), 4);
}

}  // namespace
// The pending async save belongs to the caller's saver: an async save without one is refused, a
// saver destroyed without finalize() never commits (the staged directory is not a checkpoint),
// and two savers do not see each other's pending saves.
TEST(Checkpointing, AsyncSaveBelongsToTheCallersSaver) {
  const auto root = temp_root("async_owner");
  save_checkpoint(root, make_params(1.0).list, make_state(1));
  SaveOptions async;
  async.async = true;
  auto e = test::error_message(
      [&] { save_checkpoint(root, make_params(2.0).list, make_state(2), {}, async); });
  EXPECT_NE(e.find("needs the caller's AsyncCheckpointSaver"), std::string::npos) << e;
  {
    AsyncCheckpointSaver abandoned;
    save_checkpoint(root, make_params(2.0).list, make_state(2), {}, async, &abandoned);
    EXPECT_TRUE(abandoned.pending());
    AsyncCheckpointSaver other;
    EXPECT_FALSE(other.finalize());  // nothing pending in another saver
  }  // destroyed unfinalised: the write is joined, nothing is committed
  EXPECT_EQ(read_latest_iteration(root), 1);
  EXPECT_FALSE(fs::exists(root + "/iter_0000002"));
  LoadOptions at2;
  at2.iteration = 2;
  Params q = make_params(0.0);
  e = test::error_message([&] { load_checkpoint(root, q.list, at2); });
  EXPECT_NE(e.find("iter_0000002' does not exist"), std::string::npos) << e;
  load_checkpoint(root, q.list);  // the previous checkpoint is intact
  EXPECT_EQ(q.list[0].param.to_vector<float>(), make_params(1.0).list[0].param.to_vector<float>());
  // Object storage is not built yet: a clear error, not a local directory named "msc:".
  e = test::error_message(
      [&] { save_checkpoint("msc://profile/ckpt", make_params(1.0).list, make_state(1)); });
  EXPECT_NE(e.find("object storage"), std::string::npos) << e;
  e = test::error_message([&] { read_latest_iteration("msc://profile/ckpt"); });
  EXPECT_NE(e.find("not built yet"), std::string::npos) << e;
}

}  // namespace mg::training
