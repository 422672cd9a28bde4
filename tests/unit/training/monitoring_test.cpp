// TensorBoard event files (CRC32C, TFRecord framing checked with an independent bitwise CRC, the
// Event protobufs read back, corruption detected), Megatron's timer report format and levels, the
// straggler report on one rank, the monitoring flags, and a training run writing TensorBoard
// scalars equal to its log line's values.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "megatron/core/common/error.h"
#include "megatron/core/common/progress.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/training/arguments.h"
#include "megatron/training/signal_handler.h"
#include "megatron/training/straggler.h"
#include "megatron/training/tensorboard.h"
#include "megatron/training/timers.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;
namespace tb = tensorboard;

// CRC32C bit by bit from the polynomial's definition (independent of the table implementation).
uint32_t bitwise_crc32c(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t masked(uint32_t c) {
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
uint64_t le(const std::string& s, std::size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("mg_monitoring_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::string only_event_file(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0];
}

TEST(TensorBoard, Crc32cKnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the classic check value.
  EXPECT_EQ(tb::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tb::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(tb::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(tb::crc32c(inc), 0x46DD794Eu);
  // Continuing a CRC equals the CRC of the concatenation.
  EXPECT_EQ(tb::crc32c("56789", tb::crc32c("1234")), 0xE3069283u);
  for (const std::string& s :
       std::vector<std::string>{"", "a", "brain.Event:2", std::string(1000, 'x')})
    EXPECT_EQ(tb::crc32c(s), bitwise_crc32c(s)) << s;
}

TEST(TensorBoard, FrameRecordLayout) {
  const std::string payload = "hello event";
  const std::string rec = tb::frame_record(payload);
  ASSERT_EQ(rec.size(), 8 + 4 + payload.size() + 4);
  EXPECT_EQ(le(rec, 0, 8), payload.size());
  EXPECT_EQ(le(rec, 8, 4), masked(bitwise_crc32c(rec.substr(0, 8))));
  EXPECT_EQ(rec.substr(12, payload.size()), payload);
  EXPECT_EQ(le(rec, 12 + payload.size(), 4), masked(bitwise_crc32c(payload)));
}

TEST(TensorBoard, WriterRoundTripAndCorruptionIsNamed) {
  const fs::path dir = temp_dir("roundtrip") / "nested";
  {
    tb::SummaryWriter w(dir.string(), /*queue_size=*/1);  // every add_* waits for the thread
    for (int i = 1; i <= 50; ++i) w.add_scalar("lm loss", 10.0 / i, i);
    w.add_text("seq_length", "16", 0);
    w.flush();
    w.add_scalar("learning-rate", 1e-4, 51);
  }
  const std::string path = only_event_file(dir);
  EXPECT_NE(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), std::string::npos);
  // The framing, checked here byte by byte with the bitwise CRC.
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  std::size_t pos = 0, n = 0;
  while (pos < data.size()) {
    ASSERT_LE(pos + 12, data.size());
    const uint64_t len = le(data, pos, 8);
    EXPECT_EQ(le(data, pos + 8, 4), masked(bitwise_crc32c(data.substr(pos, 8))));
    ASSERT_LE(pos + 12 + len + 4, data.size());
    EXPECT_EQ(le(data, pos + 12 + len, 4), masked(bitwise_crc32c(data.substr(pos + 12, len))));
    pos += 12 + len + 4;
    ++n;
  }
  EXPECT_EQ(pos, data.size());
  EXPECT_EQ(n, 53u);  // file_version + 50 + text + 1
  // The Event protobufs.
  const auto events = tb::read_event_file(path);
  ASSERT_EQ(events.size(), 53u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.6e9);
  for (int i = 1; i <= 50; ++i) {
    ASSERT_EQ(events[i].values.size(), 1u);
    EXPECT_EQ(events[i].step, i);
    EXPECT_EQ(events[i].values[0].tag, "lm loss");
    EXPECT_TRUE(events[i].values[0].is_scalar);
    EXPECT_EQ(events[i].values[0].scalar, static_cast<float>(10.0 / i));
  }
  EXPECT_EQ(events[51].values[0].tag, "seq_length");
  EXPECT_EQ(events[51].values[0].plugin_name, "text");
  EXPECT_FALSE(events[51].values[0].is_scalar);
  EXPECT_EQ(events[51].values[0].strings, std::vector<std::string>{"16"});
  EXPECT_EQ(events[52].values[0].tag, "learning-rate");
  EXPECT_EQ(events[52].step, 51);

  // One flipped payload byte: the data CRC fails, naming the file and the record's offset.
  std::string bad = data;
  const std::size_t second = 12 + le(data, 0, 8) + 4;
  bad[second + 14] = static_cast<char>(bad[second + 14] ^ 0x01);
  const std::string bad_path = (dir / "corrupt").string();
  std::ofstream(bad_path, std::ios::binary)
      .write(bad.data(), static_cast<std::streamsize>(bad.size()));
  try {
    tb::read_records(bad_path);
    ADD_FAILURE() << "a corrupt record was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data CRC mismatch in the record at byte " +
                                         std::to_string(second)),
              std::string::npos)
        << e.what();
  }
  // Truncated in the middle of the last record.
  std::ofstream(bad_path, std::ios::binary | std::ios::trunc)
      .write(data.data(), static_cast<std::streamsize>(data.size() - 3));
  EXPECT_THROW(tb::read_records(bad_path), Error);
  fs::remove_all(dir.parent_path());
}

// Debian's libsentencepiece carries a private protobuf 3.14; the event writer's protobuf (3.21)
// lives in its own dlopen'd module, so both work in one process, in either order.
TEST(TensorBoard, CoexistsWithTheSentencePieceTokenizer) {
  const fs::path dir = temp_dir("spm");
  tokenizers::TokenizerArgs ta;
  ta.tokenizer_type = "SentencePieceTokenizer";
  ta.tokenizer_model = std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/spm_unigram.model";
  {
    tb::SummaryWriter w(dir.string());
    auto tok = tokenizers::build_tokenizer(ta);
    const auto ids = tok->tokenize("hello world");
    EXPECT_FALSE(ids.empty());
    w.add_scalar("tokens", static_cast<double>(ids.size()), 1);
  }
  const auto events = tb::read_event_file(only_event_file(dir));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].values.at(0).tag, "tokens");
  fs::remove_all(dir);
}

TEST(TensorBoard, UnwritableDirectoryIsAClearError) {
  const fs::path file = temp_dir("notadir");
  std::ofstream(file.string()) << "x";
  try {
    tb::SummaryWriter w((file / "sub").string());
    ADD_FAILURE() << "a directory under a file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir"), std::string::npos) << e.what();
  }
  fs::remove(file);
}

TEST(Timers, MegatronFormatsAndLevels) {
  MegatronTimers t(1, "minmax");
  EXPECT_TRUE(t.active(1));
  EXPECT_FALSE(t.active(2));
  t.start("forward-backward", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t.stop("forward-backward");
  t.start("forward-compute", 2);  // above --timing-log-level 1: not timed
  t.stop("forward-compute");
  const auto s = t.log(megatron_timers_to_log(), 2.0, nullptr, /*reset=*/false);
  ASSERT_TRUE(s.has_value());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      *s, m,
      std::regex(
          R"(^\(min, max\) time across ranks \(ms\):\n    forward-backward \.{31}: \(([0-9.]+), ([0-9.]+)\)$)")))
      << *s;
  EXPECT_EQ(m[1], m[2]);
  EXPECT_GE(std::stod(m[1]), 10.0);  // 20 ms over 2 iterations
  EXPECT_LT(std::stod(m[1]), 200.0);

  MegatronTimers mx(2, "max");
  mx.start("optimizer", 1);
  mx.stop("optimizer");
  const auto s2 = mx.log({"optimizer", "never-ran"}, 1.0, nullptr);
  ASSERT_TRUE(s2.has_value());
  EXPECT_TRUE(std::regex_match(
      *s2, std::regex(R"(max time across ranks \(ms\):\n    optimizer \.{38}: [0-9]+\.[0-9]{2})")))
      << *s2;
  // reset: nothing left to report.
  EXPECT_FALSE(mx.log({"optimizer"}, 1.0, nullptr).has_value());

  MegatronTimers all(2, "all");
  all.start("batch-generator", 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  all.stop("batch-generator");
  const auto s3 = all.log({"batch-generator"}, 1.0, nullptr);
  ASSERT_TRUE(s3.has_value());
  EXPECT_TRUE(std::regex_match(
      *s3,
      std::regex(
          R"(times across ranks \(ms\):\n  batch-generator:\n     rank  0: [0-9]+\.[0-9]{2})")))
      << *s3;
  EXPECT_THROW(MegatronTimers(3, "minmax"), Error);
  EXPECT_THROW(MegatronTimers(1, "median"), Error);
}

TEST(Straggler, OneRankReportsItself) {
  StragglerDetector off(false, 1, 0);
  EXPECT_EQ(off.report(nullptr, 1e12, 1), "");
  StragglerDetector d(true, 1, 0);
  d.start_compute();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  d.stop_compute();
  d.add_batch_seconds(0.001);
  const std::string r = d.report(nullptr, 1e12, 1);
  EXPECT_TRUE(std::regex_search(
      r, std::regex(
             R"(\| MnRtt/Rnk: [0-9.]+ms/0 \| MxRtt/Rnk: [0-9.]+ms/0 \| MnDRtt/Rnk: 1\.00ms/0)")))
      << r;
  EXPECT_EQ(r.find("straggler: slowest"), std::string::npos) << r;  // one rank: nobody to name
}

std::vector<std::string> base_args() {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "32",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "16",
          "--max-position-embeddings",
          "16",
          "--micro-batch-size",
          "2",
          "--global-batch-size",
          "4",
          "--train-iters",
          "4",
          "--lr",
          "1e-3",
          "--mock-data",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "300",
          "--log-interval",
          "2",
          "--eval-iters",
          "1",
          "--eval-interval",
          "2",
          "--seed",
          "3"};
}

std::vector<std::string> with(std::vector<std::string> extra) {
  auto v = base_args();
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

// base_args() with `flag`'s value replaced.
std::vector<std::string> set(std::vector<std::string> args, const std::string& flag,
                             const std::string& value) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) args[i + 1] = value;
  return args;
}

TEST(MonitoringFlags, ParsedAndChecked) {
  const Arguments a = parse_args(with(
      {"--tensorboard-dir", "/tmp/x", "--tensorboard-log-interval", "5", "--tensorboard-queue-size",
       "7", "--log-timers-to-tensorboard", "--no-log-learning-rate-to-tensorboard",
       "--timing-log-level", "2", "--timing-log-option", "all", "--exit-signal-handler",
       "--enable-straggler-detection", "--straggler-minmax-count", "3"}));
  const auto& m = a.monitoring;
  EXPECT_EQ(*m.tensorboard_dir, "/tmp/x");
  EXPECT_EQ(m.tensorboard_log_interval, 5);
  EXPECT_EQ(m.tensorboard_queue_size, 7);
  EXPECT_TRUE(m.log_timers_to_tensorboard);
  EXPECT_FALSE(m.log_learning_rate_to_tensorboard);
  EXPECT_TRUE(m.log_loss_scale_to_tensorboard);
  EXPECT_EQ(m.timing_log_level, 2);
  EXPECT_EQ(m.timing_log_option, "all");
  EXPECT_TRUE(m.exit_signal_handler);
  EXPECT_TRUE(m.log_straggler);
  EXPECT_EQ(m.straggler_minmax_count, 3);
  const Arguments d = parse_args(base_args());
  EXPECT_FALSE(d.monitoring.tensorboard_dir.has_value());
  EXPECT_EQ(d.monitoring.timing_log_level, 0);
  EXPECT_EQ(d.monitoring.timing_log_option, "minmax");
  EXPECT_FALSE(d.monitoring.exit_signal_handler);

  auto error_of = [](const std::vector<std::string>& args) -> std::string {
    try {
      parse_args(args);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(with({"--wandb-project", "p"})).find("--wandb-project p: Weights & Biases"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--timing-log-level", "3"}))
                .find("--timing-log-level must be 0, 1 or 2, got 3"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--timing-log-option", "avg"})).find("--timing-log-option"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--tensorboard-log-interval", "0"}))
                .find("--tensorboard-log-interval must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--straggler-minmax-count", "0"}))
                .find("--straggler-minmax-count must be >= 1, got 0"),
            std::string::npos);
}

// A training run's TensorBoard scalars are its log line's values (lm loss per iteration, the
// learning rate), the validation loss, and the flags as text.
TEST(MonitoringRun, TensorBoardScalarsMatchTheLog) {
  const fs::path dir = temp_dir("run");
  std::ostringstream log;
  const Arguments a =
      parse_args(with({"--tensorboard-dir", dir.string(), "--log-validation-ppl-to-tensorboard",
                       "--log-timers-to-tensorboard", "--timing-log-level", "1"}));
  const PretrainResult r = pretrain(a, log);
  const auto events = tb::read_event_file(only_event_file(dir));
  std::map<std::string, std::map<int64_t, float>> scalars;
  std::map<std::string, std::string> texts;
  for (const auto& e : events)
    for (const auto& v : e.values) {
      if (v.is_scalar) scalars[v.tag][e.step] = v.scalar;
      if (v.plugin_name == "text" && !v.strings.empty()) texts[v.tag] = v.strings[0];
    }
  ASSERT_EQ(scalars["lm loss"].size(), 4u) << log.str();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(scalars["lm loss"][i + 1],
              static_cast<float>(r.train_losses[static_cast<std::size_t>(i)]));
  EXPECT_EQ(scalars["lm loss vs samples"].count(16), 1u);  // iteration 4 x gbs 4
  EXPECT_EQ(scalars["learning-rate"].size(), 4u);
  EXPECT_EQ(scalars["loss-scale"][1], 1.0f);
  EXPECT_EQ(scalars["grad-norm"].size(), 4u);
  EXPECT_EQ(scalars["grad-norm"][4], static_cast<float>(r.grad_norms[3]));
  ASSERT_TRUE(r.valid_loss.has_value());
  EXPECT_EQ(scalars["lm loss validation"][4], static_cast<float>(*r.valid_loss));
  EXPECT_EQ(scalars["lm loss validation ppl"][4], static_cast<float>(std::exp(*r.valid_loss)));
  EXPECT_EQ(scalars["forward-backward-time"].size(), 4u);
  EXPECT_EQ(scalars["optimizer-time"].size(), 4u);
  EXPECT_EQ(scalars["iteration-time"].size(), 2u);       // at the log interval
  EXPECT_EQ(scalars.count("forward-compute-time"), 0u);  // level 2
  EXPECT_EQ(scalars.count("world-size"), 0u);            // not asked for
  EXPECT_EQ(scalars.count("mem-allocated-bytes"), 0u);
  EXPECT_EQ(texts["seq_length"], "16");
  EXPECT_EQ(texts["log_validation_ppl_to_tensorboard"], "True");
  // The timers' report follows each log line.
  EXPECT_NE(log.str().find("(min, max) time across ranks (ms):\n    forward-backward ...."),
            std::string::npos)
      << log.str();
  fs::remove_all(dir);
}

// --exit-signal-handler on one rank: a SIGTERM (SIGINT) raised during iteration 3 lets it finish,
// saves it, skips the final evaluation; resuming reproduces the uninterrupted run bit for bit
// (checked for SIGTERM).
void signal_stops_and_resumes(int sig, bool check_resume) {
  const fs::path dir = temp_dir(std::string("signal") + std::to_string(sig));
  const std::vector<std::string> base =
      set(set(set(base_args(), "--train-iters", "6"), "--eval-iters", "0"), "--log-interval", "1");

  auto args = base;
  for (const char* f : {"--exit-signal-handler", "--save"}) args.push_back(f);
  args.push_back(dir.string());
  PretrainHooks hooks;
  hooks.after_forward_backward = [sig](int64_t iteration, double, models::LanguageModule&) {
    if (iteration == 2) std::raise(sig);  // during the third iteration
  };
  std::ostringstream log1;
  const PretrainResult first = pretrain(parse_args(args), log1, hooks);
  EXPECT_EQ(first.exit_reason, "signal") << log1.str();
  EXPECT_EQ(first.iteration, 3);
  ASSERT_TRUE(first.saved_iteration.has_value());
  EXPECT_EQ(*first.saved_iteration, 3);
  EXPECT_NE(
      log1.str().find(std::string(" received ") + signal_name(sig) + " (--exit-signal-handler)"),
      std::string::npos)
      << log1.str();
  EXPECT_NE(log1.str().find("exiting program at iteration 3 (signal)"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "iter_0000003"));
  // The handler is gone with the run: the previous disposition is back.
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);

  if (!check_resume) {
    fs::remove_all(dir);
    return;
  }
  std::ostringstream full_log;
  const PretrainResult full = pretrain(parse_args(base), full_log);
  ASSERT_EQ(full.train_losses.size(), 6u);
  auto resume = base;
  resume.push_back("--load");
  resume.push_back(dir.string());
  std::ostringstream log2;
  const PretrainResult second = pretrain(parse_args(resume), log2);
  ASSERT_EQ(second.train_losses.size(), 3u) << log2.str();
  std::vector<double> joined = first.train_losses;
  joined.insert(joined.end(), second.train_losses.begin(), second.train_losses.end());
  EXPECT_EQ(joined, full.train_losses);  // bit-exact
  std::vector<double> norms = first.grad_norms;
  norms.insert(norms.end(), second.grad_norms.begin(), second.grad_norms.end());
  EXPECT_EQ(norms, full.grad_norms);
  fs::remove_all(dir);
}

TEST(MonitoringRun, SigtermFinishesTheIterationSavesAndResumesBitExactly) {
  signal_stops_and_resumes(SIGTERM, true);
}
TEST(MonitoringRun, SigintStopsAndSavesToo) {
  signal_stops_and_resumes(SIGINT, false);
}

TEST(Progress, QuietThenDoneTotalAndEta) {
  std::ostringstream out;
  std::ostream* previous = set_progress_sink(&out);
  double now = 100.0;
  {
    Progress p("building the sample index", 1000, 2.0, 10.0, [&now] { return now; });
    now += 1.0;
    p.update(100);  // within the quiet time: nothing
    EXPECT_EQ(out.str(), "");
    now += 2.0;
    p.update(250);  // 3 s for 250 of 1000: 9 s to go
    now += 5.0;
    p.update(600);  // within the interval: nothing
    now += 6.0;
    p.update(700);  // 14 s for 700: 6 s to go
    now += 1.0;
    p.finish();
  }
  EXPECT_EQ(out.str(),
            " > building the sample index: 250/1000 (25.0%), 3.0 s, ETA 9.0 s\n"
            " > building the sample index: 700/1000 (70.0%), 14.0 s, ETA 6.0 s\n"
            " > building the sample index: 1000/1000 (100.0%) in 15.0 s\n");
  out.str("");
  {
    Progress quick("short work", 10, 2.0, 10.0, [&now] { return now; });
    quick.update(10);
  }
  EXPECT_EQ(out.str(), "");  // finished within the quiet time: silent
  set_progress_sink(previous);
}

// With the thresholds at 0 (MG_PROGRESS_*), pretrain's start-up work prints its progress lines
// to rank 0's log: the sample index while building the datasets, the tensors of a checkpoint load.
TEST(Progress, PretrainPrintsStartUpProgress) {
  const fs::path dir = temp_dir("progress");
  const auto args = set(set(base_args(), "--eval-iters", "0"), "--train-iters", "3");
  auto save = args;
  save.insert(save.end(), {"--save", dir.string(), "--exit-interval", "2"});
  std::ostringstream log1;
  pretrain(parse_args(save), log1);
  ::setenv("MG_PROGRESS_QUIET_SECONDS", "0", 1);
  ::setenv("MG_PROGRESS_INTERVAL_SECONDS", "0", 1);
  auto load = args;
  load.insert(load.end(), {"--load", dir.string()});
  std::ostringstream log2;
  pretrain(parse_args(load), log2);
  ::unsetenv("MG_PROGRESS_QUIET_SECONDS");
  ::unsetenv("MG_PROGRESS_INTERVAL_SECONDS");
  EXPECT_EQ(log1.str().find(" > building the sample index"), std::string::npos) << log1.str();
  EXPECT_TRUE(std::regex_search(
      log2.str(),
      std::regex(
          R"( > loading the tensors of .*iter_0000002: [0-9]+/[0-9]+ \(100\.0%\) in [0-9.]+ s)")))
      << log2.str();
  EXPECT_TRUE(std::regex_search(
      log2.str(),
      std::regex(
          R"( > building the sample index: ([0-9]+)/\1 \(100\.0%\), [0-9.]+ s, ETA 0\.0 s)")))
      << log2.str();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mg::training
