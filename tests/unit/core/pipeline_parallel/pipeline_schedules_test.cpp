// Pipeline parallelism (megatron/core/pipeline_parallel/):
//  * the schedule order of 1F1B and interleaved 1F1B against tables worked out by hand from
//    Megatron's rules (warm-up, steady state, cool-down; the interleaved schedule table);
//  * the activation bound: in 1F1B a stage holds at most min(PP - rank, M) micro-batches;
//  * the layer layout (even, uneven, virtual) and its refusals, naming the numbers;
//  * np 2: a peer that never sends ends in the pipeline group's timeout, naming the group;
//  * under mpirun -np 2 / 4 (label mpi; alone the multi-rank cases skip): a tiny GPT-2 (tied
//    embeddings) and LLaMA (untied) split over the world as the pipeline, 1F1B and interleaved,
//    against the whole model on one rank in f64: lm loss equal, every stage's gradient equal to
//    the reference's gradient of the same global name (the tied embedding after the embedding-
//    group sum, on both copies), the in-flight micro-batches within the 1F1B bound, and the peak
//    activation bytes of every stage measured and printed; then 3 AdamW steps (clip 0.05, so the
//    grad norm summed over the stages with the tied copy counted once decides the update): the
//    grad norms, losses and every weight equal the one-rank run's.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <string>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/runtime.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::pipeline_parallel {
namespace {

using namespace std::chrono_literals;

std::string order_1f1b(int pp, int rank, int64_t m) {
  return schedule_str(schedule_1f1b(pp, rank, m, false), false);
}
std::string order_interleaved(int pp, int rank, int vp, int64_t m) {
  return schedule_str(schedule_interleaved(pp, rank, vp, m, false), true);
}

// PP 4, 6 micro-batches: warm-up PP - rank - 1 forwards, then one forward + one backward, then
// the remaining backwards.
TEST(PipelineSchedule, OneFOneBOrderByHand) {
  EXPECT_EQ(order_1f1b(4, 0, 6), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(order_1f1b(4, 1, 6), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(order_1f1b(4, 2, 6), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(order_1f1b(4, 3, 6), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: warm-up is cut to M.
  EXPECT_EQ(order_1f1b(4, 0, 2), "F0 F1 B0 B1");
  EXPECT_EQ(order_1f1b(4, 3, 2), "F0 B0 F1 B1");
  // Forward only (evaluation): every forward, in order.
  EXPECT_EQ(schedule_str(schedule_1f1b(4, 1, 3, true), false), "F0 F1 F2");
}

// PP 2, VP 2, 4 micro-batches. Schedule table (groups of PP micro-batches per chunk):
// k 0..7 -> (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backward k uses chunk V-1-chunk.
// Warm-up: (PP - rank - 1) * 2 + (V - 1) * PP = 4 on rank 0, 2 on rank 1.
TEST(PipelineSchedule, InterleavedOrderByHand) {
  EXPECT_EQ(order_interleaved(2, 0, 2, 4),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order_interleaved(2, 1, 2, 4),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(schedule_str(schedule_interleaved(2, 1, 2, 2, true), true), "F0.0 F1.0 F0.1 F1.1");
}

TEST(PipelineSchedule, InterleavedNeedsMultipleOfPP) {
  const auto e = test::error_message([] { schedule_interleaved(4, 0, 2, 6, false); });
  EXPECT_NE(e.find("micro-batches (6"), std::string::npos) << e;
  EXPECT_NE(e.find("--pipeline-model-parallel-size 4"), std::string::npos) << e;
  EXPECT_NO_THROW(schedule_interleaved(4, 0, 2, 8, false));
}

// Every table is complete (each micro-batch and chunk once forward and once backward, backward
// after forward) and 1F1B holds at most min(PP - rank, M) micro-batches at once.
TEST(PipelineSchedule, TablesCompleteAndActivationBound) {
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 3, 4, 8, 13})
      for (int rank = 0; rank < pp; ++rank) {
        const auto steps = schedule_1f1b(pp, rank, m, false);
        std::map<int64_t, int> seen;
        int64_t in_flight = 0, peak = 0;
        for (const auto& s : steps) {
          if (s.pass == Pass::forward) {
            EXPECT_EQ(seen[s.microbatch]++, 0);
            peak = std::max(peak, ++in_flight);
          } else {
            EXPECT_EQ(seen[s.microbatch]++, 1);
            --in_flight;
          }
        }
        EXPECT_EQ(static_cast<int64_t>(steps.size()), 2 * m);
        EXPECT_EQ(peak, std::min<int64_t>(pp - rank, m)) << "PP " << pp << " rank " << rank;
      }
  for (int pp : {2, 4})
    for (int vp : {2, 3})
      for (int64_t m : {int64_t{pp}, int64_t{2 * pp}, int64_t{3 * pp}})
        for (int rank = 0; rank < pp; ++rank) {
          std::map<std::pair<int64_t, int>, int> seen;
          for (const auto& s : schedule_interleaved(pp, rank, vp, m, false))
            EXPECT_EQ(seen[std::make_pair(s.microbatch, s.chunk)]++,
                      s.pass == Pass::forward ? 0 : 1);
          EXPECT_EQ(static_cast<int64_t>(seen.size()), m * vp);
        }
}

TEST(PipelineLayout, EvenUnevenVirtual) {
  auto l = make_pipeline_layout(8, 2, 1, std::nullopt, std::nullopt, std::nullopt);
  EXPECT_EQ(l.str(), "PP 2: rank 0 layers [0, 4), rank 1 layers [4, 8)");
  l = make_pipeline_layout(8, 2, 2, std::nullopt, std::nullopt, std::nullopt);
  EXPECT_EQ(l.str(), "PP 2 x VP 2: rank 0 layers [0, 2) [4, 6), rank 1 layers [2, 4) [6, 8)");
  EXPECT_TRUE(l.chunks(0)[0].pre_process);
  EXPECT_FALSE(l.chunks(0)[1].pre_process);
  EXPECT_TRUE(l.chunks(1)[1].post_process);
  EXPECT_FALSE(l.chunks(1)[0].post_process);
  l = make_pipeline_layout(8, 2, 1, int64_t{2}, std::nullopt, std::nullopt);  // 2 per virtual stage
  EXPECT_EQ(l.vp, 2);
  l = make_pipeline_layout(10, 4, 1, std::nullopt, int64_t{1}, int64_t{3});
  EXPECT_EQ(l.str(),
            "PP 4: rank 0 layers [0, 1), rank 1 layers [1, 4), rank 2 layers [4, 7), "
            "rank 3 layers [7, 10)");
  l = make_pipeline_layout(5, 2, 1, std::nullopt, int64_t{2}, std::nullopt);
  EXPECT_EQ(l.str(), "PP 2: rank 0 layers [0, 2), rank 1 layers [2, 5)");
}

TEST(PipelineLayout, RefusalsNameTheNumbers) {
  auto e = test::error_message(
      [] { make_pipeline_layout(30, 4, 1, std::nullopt, std::nullopt, std::nullopt); });
  EXPECT_NE(e.find("--num-layers 30 is not divisible by --pipeline-model-parallel-size 4"),
            std::string::npos)
      << e;
  e = test::error_message(
      [] { make_pipeline_layout(10, 4, 1, std::nullopt, int64_t{2}, std::nullopt); });
  EXPECT_NE(e.find("leaves 8 layer(s) for the other 3 pipeline rank(s)"), std::string::npos) << e;
  e = test::error_message(
      [] { make_pipeline_layout(8, 2, 2, int64_t{2}, std::nullopt, std::nullopt); });
  EXPECT_NE(e.find("mutually exclusive"), std::string::npos) << e;
  e = test::error_message(
      [] { make_pipeline_layout(6, 2, 2, std::nullopt, std::nullopt, std::nullopt); });
  EXPECT_NE(e.find("pipeline rank 0 has 3 layers, not divisible by the virtual pipeline size 2"),
            std::string::npos)
      << e;
  e = test::error_message(
      [] { make_pipeline_layout(4, 1, 2, std::nullopt, std::nullopt, std::nullopt); });
  EXPECT_NE(e.find("needs --pipeline-model-parallel-size > 1"), std::string::npos) << e;
}

// ---- Multi-rank: the world is the pipeline ---------------------------------------------------

comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> c = [] {
    auto p = comm::init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}

struct PipeCase {
  bool llama;
  int vp;
  std::string platform = "cpu";  // "cuda": activations sent between stages as device tensors
};

void run_pipe_case(const PipeCase& pc) {
  test::ensure_runtime();
  comm::Communicator& comm = world();
  const int pp = comm.world_size(), rank = comm.world_rank();
  if (pp == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const ops::OpTable& ops = test::ops_on(pc.platform);
  const Device dev = test::device_for(pc.platform);
  transformer::TransformerConfig c =
      pc.llama ? test::tiny_llama_config(DType::f64) : test::tiny_gpt2_config(DType::f64);
  c.num_layers = 2 * pp * pc.vp;
  c.hidden_dropout = 0.1;  // dropout seeds follow global layer numbers: equal masks
  const int64_t vocab = 37, mbs = 2, m = 2 * pp;
  const auto spec = models::get_gpt_decoder_block_spec(c);
  models::GPTModel ref(c, vocab, ops, dev, spec);
  ref.init_weights(11);
  const auto layout =
      make_pipeline_layout(c.num_layers, pp, pc.vp, std::nullopt, std::nullopt, std::nullopt);
  models::GPTModelParallel par;
  par.pipeline_chunks = layout.chunks(rank);
  models::GPTModel stage(c, vocab, ops, dev, spec, par);
  stage.init_weights(11);
  EXPECT_EQ(stage.num_chunks(), pc.vp);

  std::vector<models::GPTBatch> batches;
  for (int64_t i = 0; i < m; ++i)
    batches.push_back(test::random_batch(mbs, c.seq_length, vocab, 100 + static_cast<uint64_t>(i)));
  auto feeder = [&batches] {
    return [&batches, i = std::size_t{0}]() mutable { return batches.at(i++); };
  };
  ForwardBackwardConfig cfg;
  const models::StepRng rng{5, 3, 0};
  ref.zero_grad();
  const auto want = forward_backward_no_pipelining(ref, feeder(), m, cfg, rng);

  cfg.pp_group = comm.world().get();
  cfg.seq_length = c.seq_length;
  cfg.micro_batch_size = mbs;
  plugin::Platform& plat = plugin::global_registry().platform(dev.type);  // the stages' device
  cfg.memory_in_use = [&plat, dev] {
    return static_cast<int64_t>(plat.memory_stats(dev.index).allocated_bytes);
  };
  stage.zero_grad();
  const auto fb = get_forward_backward_func(pp, pc.vp)(stage, feeder(), m, cfg, rng);
  // Tied embeddings: the first and last stage sum their copies' grads (the embedding group).
  auto emb = comm.new_groups({{0, pp - 1}}, "embedding");
  if (!c.untie_embeddings_and_output_weights && emb) {
    Tensor g = stage.parameter("embedding.word_embeddings.weight").main_grad;
    emb->all_reduce(g, comm::ReduceOp::sum)->wait();
  }
  EXPECT_NEAR(fb.lm_loss, want.lm_loss, 1e-12 * std::abs(want.lm_loss));
  EXPECT_NEAR(fb.num_tokens, want.num_tokens, 0.0);
  int shared = 0;
  for (const auto& p : stage.parameters()) {
    shared += p.shared;
    const auto a = p.main_grad.to_vector<double>();
    const auto b = ref.parameter(p.name).main_grad.to_vector<double>();
    ASSERT_EQ(a.size(), b.size()) << p.name;
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - b[i]));
      scale = std::max(scale, std::abs(b[i]));
    }
    EXPECT_LE(worst, 1e-12 * std::max(scale, 1.0)) << "rank " << rank << ": " << p.name;
  }
  // The last stage's copy of the tied embedding is the only shared parameter.
  EXPECT_EQ(shared, !c.untie_embeddings_and_output_weights && rank == pp - 1 ? 1 : 0);
  // 1F1B: min(PP - rank, M); interleaved: its warm-up + 1, (PP - rank - 1) * 2 + (V - 1) * PP + 1.
  const int64_t bound =
      pc.vp == 1 ? std::min<int64_t>(pp - rank, m)
                 : std::min<int64_t>((pp - rank - 1) * 2 + (pc.vp - 1) * pp + 1, m * pc.vp);
  EXPECT_LE(fb.max_in_flight, bound);
  EXPECT_GT(fb.peak_activation_bytes, 0);
  std::cout << "[pipeline " << (pc.llama ? "llama" : "gpt2") << " PP " << pp << " VP " << pc.vp
            << "] stage " << rank << ": peak in-flight micro-batches " << fb.max_in_flight
            << " (bound " << bound << "), peak activation bytes " << fb.peak_activation_bytes
            << std::endl;

  // 3 optimizer steps (the first on the gradients above): grad norms, losses and weights.
  optimizer::OptimizerConfig oc;
  oc.lr = 1e-2;
  oc.params_dtype = DType::f64;
  oc.clip_grad = 0.05;  // below the grad norm: a norm counting the tied copy twice shows
  optimizer::MegatronOptimizer ref_opt(oc, ref.parameters(), ref.buffer(), ops);
  optimizer::MegatronOptimizer stage_opt(oc, stage.parameters(), stage.buffer(), ops, {}, {},
                                         {.pp = comm.world()});
  for (int it = 0; it < 3; ++it) {
    if (it > 0) {
      const models::StepRng rng_it{5, 3 + it, 0};
      ref.zero_grad();
      const auto w = forward_backward_no_pipelining(ref, feeder(), m, {}, rng_it);
      stage.zero_grad();
      const auto f = get_forward_backward_func(pp, pc.vp)(stage, feeder(), m, cfg, rng_it);
      if (!c.untie_embeddings_and_output_weights && emb) {
        Tensor g = stage.parameter("embedding.word_embeddings.weight").main_grad;
        emb->all_reduce(g, comm::ReduceOp::sum)->wait();
      }
      EXPECT_NEAR(f.lm_loss, w.lm_loss, 1e-12 * std::abs(w.lm_loss)) << "iteration " << it;
    }
    const auto rs = ref_opt.step(1e-2, 0.01);
    const auto ss = stage_opt.step(1e-2, 0.01);
    EXPECT_GT(rs.grad_norm, oc.clip_grad);
    EXPECT_NEAR(ss.grad_norm, rs.grad_norm, 1e-12 * rs.grad_norm) << "iteration " << it;
  }
  for (const auto& p : stage.parameters()) {
    const auto a = p.param.to_vector<double>();
    const auto b = ref.parameter(p.name).param.to_vector<double>();
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    EXPECT_LE(worst, 1e-10) << "rank " << rank << ": weight " << p.name;
  }
}

// A schedule whose peer never sends (here rank 1 runs one micro-batch fewer than rank 0) ends in
// the pipeline group's timeout with a message naming the group, never a silent hang.
TEST(PipelineSchedule, MissingPeerEndsInTimeout) {
  test::ensure_runtime();
  comm::Communicator& comm = world();
  if (comm.world_size() != 2) GTEST_SKIP() << "needs mpirun -np 2";
  const int rank = comm.world_rank();
  // Its own communicator: the unmatched message cannot reach another test's receive.
  auto g = comm.new_groups({{0, 1}}, "pp-hang");
  g->set_timeout(500ms);
  const Shape shape{2, 1, 4};
  StageFunctions fns;
  fns.forward = [&](int, int64_t, const Tensor&) {
    return rank == 0 ? Tensor::zeros(shape, DType::f32) : Tensor();
  };
  fns.backward = [&](int, int64_t, const Tensor&) {
    return rank == 1 ? Tensor::zeros(shape, DType::f32) : Tensor();
  };
  const auto steps = schedule_1f1b(2, rank, rank == 0 ? 2 : 1, false);
  if (rank == 0) {
    const auto e = test::error_message(
        [&] { run_pipeline_schedule(steps, 1, *g, shape, DType::f32, Device::cpu(), fns); });
    EXPECT_NE(e.find("pp-hang"), std::string::npos) << e;
    EXPECT_NE(e.find("did not finish within 500 ms"), std::string::npos) << e;
  } else {
    EXPECT_NO_THROW(run_pipeline_schedule(steps, 1, *g, shape, DType::f32, Device::cpu(), fns));
  }
  comm.world()->barrier();
}

TEST(PipelineGPT, OneFOneBGpt2TiedMatchesOneRank) {
  run_pipe_case({false, 1});
}
TEST(PipelineGPT, OneFOneBLlamaUntiedMatchesOneRank) {
  run_pipe_case({true, 1});
}
TEST(PipelineGPT, InterleavedGpt2TiedMatchesOneRank) {
  run_pipe_case({false, 2});
}
TEST(PipelineGPT, InterleavedLlamaMatchesOneRank) {
  run_pipe_case({true, 2});
}
// 1F1B and interleaved on the CUDA platform, every stage on GPU 0 through the MPI backend
// (skipped, printing why, without a usable GPU).
TEST(PipelineGPT, OneFOneBGpt2TiedMatchesOneRankCuda) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  run_pipe_case({false, 1, "cuda"});
}
TEST(PipelineGPT, InterleavedLlamaMatchesOneRankCuda) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  run_pipe_case({true, 2, "cuda"});
}

}  // namespace
}  // namespace mg::pipeline_parallel
