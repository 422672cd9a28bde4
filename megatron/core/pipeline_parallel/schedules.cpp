// Forward-backward schedules: no pipelining, 1F1B, interleaved 1F1B (schedules.h).
#include "megatron/core/pipeline_parallel/schedules.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/pipeline_parallel/p2p_communication.h"

namespace mg::pipeline_parallel {

double loss_backward_seed(const ForwardBackwardConfig& config, double num_tokens,
                          int64_t num_microbatches, int64_t microbatch) {
  // Megatron: output_tensor = loss_sum (per-token) or loss_sum / num_tokens / num_microbatches,
  // times the loss scale, is what backward starts from.
  double dloss = config.loss_scale;
  if (!config.calculate_per_token_loss) {
    MG_CHECK(num_tokens > 0.0, "micro-batch " << microbatch << " has no unmasked token (loss_mask "
                                              << "sums to 0): its mean loss is undefined");
    dloss /= num_tokens * static_cast<double>(num_microbatches);
  }
  return dloss;
}

double aux_loss_scale(const ForwardBackwardConfig& config, int64_t num_microbatches,
                      int64_t cp_size) {
  if (config.calculate_per_token_loss) return config.loss_scale;
  const double scale = config.loss_scale / static_cast<double>(num_microbatches);
  return cp_size > 1 ? scale * static_cast<double>(cp_size) : scale;  // CP 1: bit-identical
}

ForwardBackwardResult forward_backward_no_pipelining(models::LanguageModule& model,
                                                     const NextBatchFn& next_batch,
                                                     int64_t num_microbatches,
                                                     const ForwardBackwardConfig& config,
                                                     const models::StepRng& rng) {
  MG_CHECK(num_microbatches >= 1, "num_microbatches must be >= 1, got " << num_microbatches);
  MG_CHECK(model.num_chunks() == 1 && model.chunk(0).pre_process && model.chunk(0).post_process,
           "forward_backward_no_pipelining runs the whole model; this one is a pipeline stage ("
               << model.num_chunks() << " chunk(s)): use a pipelined schedule");
  ForwardBackwardResult r;
  // FP8 weights cast on their first use in this call, reused by the later micro-batches (TE's
  // is_first_microbatch).
  const fp8::Fp8State::WeightCacheScope fp8_weights(model.fp8_state());
  const std::unique_ptr<models::ForwardState> state = model.new_forward_state();
  for (int64_t i = 0; i < num_microbatches; ++i) {
    const models::Batch batch = next_batch();
    const models::StepRng mb_rng{rng.seed, rng.iteration, i};
    models::LossSums sums;
    {
      ScopedTimer t(config.timers, "forward-compute", 2);
      model.forward_chunk(0, batch, Tensor(), *state, mb_rng, !config.forward_only, &sums);
    }
    r.microbatches.push_back(sums);
    r.num_tokens += sums.num_tokens;
    if (config.forward_only) {
      state->clear();
      continue;
    }
    const double dloss = loss_backward_seed(config, sums.num_tokens, num_microbatches, i);
    if (config.set_is_last_microbatch) config.set_is_last_microbatch(i == num_microbatches - 1);
    ScopedTimer t(config.timers, "backward-compute", 2);
    model.backward_chunk(*state, Tensor(), dloss);
  }
  // The step's losses, read once (they stayed on the device), summed in micro-batch order.
  std::vector<models::LossSums*> pending;
  for (auto& m : r.microbatches) pending.push_back(&m);
  models::resolve_loss_sums(pending);
  for (const auto& m : r.microbatches) r.loss_sum += m.loss_sum;
  r.lm_loss = r.num_tokens > 0.0 ? r.loss_sum / r.num_tokens : 0.0;
  return r;
}

// ---- Schedule tables ------------------------------------------------------------------------

std::string schedule_str(const std::vector<ScheduleStep>& steps, bool with_chunks) {
  std::ostringstream s;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (i) s << ' ';
    s << (steps[i].pass == Pass::forward ? 'F' : 'B') << steps[i].microbatch;
    if (with_chunks) s << '.' << steps[i].chunk;
  }
  return s.str();
}

namespace {

void check_rank(int pp_size, int pp_rank) {
  MG_CHECK(pp_size >= 1 && pp_rank >= 0 && pp_rank < pp_size,
           "pipeline rank " << pp_rank << " is outside [0, " << pp_size << ")");
}

}  // namespace

std::vector<ScheduleStep> schedule_1f1b(int pp_size, int pp_rank, int64_t num_microbatches,
                                        bool forward_only) {
  check_rank(pp_size, pp_rank);
  MG_CHECK(num_microbatches >= 1, "num_microbatches must be >= 1, got " << num_microbatches);
  const int64_t m = num_microbatches;
  const int64_t warmup = forward_only ? m : std::min<int64_t>(pp_size - pp_rank - 1, m);
  const int64_t remaining = m - warmup;
  std::vector<ScheduleStep> steps;
  for (int64_t i = 0; i < warmup; ++i) steps.push_back({Pass::forward, i, 0});
  for (int64_t i = 0; i < remaining; ++i) {  // steady state: one forward, one backward
    steps.push_back({Pass::forward, warmup + i, 0});
    if (!forward_only) steps.push_back({Pass::backward, i, 0});
  }
  if (!forward_only)
    for (int64_t i = remaining; i < m; ++i) steps.push_back({Pass::backward, i, 0});  // cool-down
  return steps;
}

void check_interleaved_microbatches(int pp_size, int64_t num_microbatches) {
  MG_CHECK(num_microbatches >= pp_size && num_microbatches % pp_size == 0,
           "the interleaved pipeline schedule needs the number of micro-batches ("
               << num_microbatches << " = global batch / (micro batch x data-parallel size)) to "
               << "be a multiple of --pipeline-model-parallel-size " << pp_size
               << " (Megatron's groups of PP contiguous micro-batches per virtual stage)");
}

std::vector<ScheduleStep> schedule_interleaved(int pp_size, int pp_rank, int vp_size,
                                               int64_t num_microbatches, bool forward_only) {
  check_rank(pp_size, pp_rank);
  MG_CHECK(vp_size >= 1, "virtual pipeline size must be >= 1, got " << vp_size);
  check_interleaved_microbatches(pp_size, num_microbatches);
  const int64_t m = num_microbatches, group = pp_size;
  // Megatron's schedule table: per group of `group` micro-batches, every chunk in turn.
  std::vector<std::pair<int64_t, int>> table;
  for (int64_t g = 0; g < m; g += group) {
    const int64_t end = g + group >= m ? m : g + group;
    for (int v = 0; v < vp_size; ++v)
      for (int64_t mb = g; mb < end; ++mb) table.emplace_back(mb, v);
  }
  const int64_t total = m * vp_size;
  int64_t warmup = total;
  if (!forward_only) {
    warmup = static_cast<int64_t>(pp_size - pp_rank - 1) * 2 + (vp_size - 1) * group;
    warmup = std::min(warmup, total);
  }
  const int64_t remaining = total - warmup;
  auto fwd = [&](int64_t k) {
    return ScheduleStep{Pass::forward, table[k].first, table[k].second};
  };
  auto bwd = [&](int64_t k) {
    return ScheduleStep{Pass::backward, table[k].first, vp_size - 1 - table[k].second};
  };
  std::vector<ScheduleStep> steps;
  for (int64_t k = 0; k < warmup; ++k) steps.push_back(fwd(k));
  for (int64_t k = 0; k < remaining; ++k) {
    steps.push_back(fwd(k + warmup));
    steps.push_back(bwd(k));
  }
  if (!forward_only)
    for (int64_t k = remaining; k < total; ++k) steps.push_back(bwd(k));
  return steps;
}

// ---- Execution ------------------------------------------------------------------------------

PipelineRunStats run_pipeline_schedule(const std::vector<ScheduleStep>& steps, int num_chunks,
                                       comm::ProcessGroup& pp_group, const Shape& shape,
                                       DType dtype, Device device, const StageFunctions& fns,
                                       const std::function<int64_t()>& memory_in_use) {
  const int pp = pp_group.size(), rank = pp_group.rank();
  MG_CHECK(pp > 1, "run_pipeline_schedule needs a pipeline group of more than one rank");
  const int num_stages = pp * num_chunks;
  const int prev = (rank - 1 + pp) % pp, next = (rank + 1) % pp;
  auto stage_of = [&](int chunk) { return chunk * pp + rank; };
  // The receive step i needs: the previous virtual stage's output (forward, not on stage 0) or
  // the next one's input gradient (backward, not on the last stage).
  auto recv_of = [&](const ScheduleStep& st) -> std::optional<std::pair<int, int>> {
    const int s = stage_of(st.chunk);
    if (st.pass == Pass::forward) {
      if (s == 0) return std::nullopt;
      return std::make_pair(prev, P2PCommunicator::tag(st.microbatch, s - 1, num_stages, false));
    }
    if (s == num_stages - 1) return std::nullopt;
    return std::make_pair(next, P2PCommunicator::tag(st.microbatch, s + 1, num_stages, true));
  };

  P2PCommunicator p2p(pp_group, shape, dtype, device);
  std::vector<std::optional<P2PCommunicator::Recv>> posted(steps.size());
  auto post = [&](std::size_t i) {
    if (i >= steps.size() || posted[i]) return;
    if (auto r = recv_of(steps[i])) posted[i] = p2p.post_recv(r->first, r->second);
  };
  PipelineRunStats stats;
  const int64_t base = memory_in_use ? memory_in_use() : 0;
  int64_t in_flight = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const ScheduleStep& st = steps[i];
    MG_CHECK(st.chunk >= 0 && st.chunk < num_chunks, "schedule step " << i << ": chunk " << st.chunk
                                                                      << " outside [0, "
                                                                      << num_chunks << ")");
    post(i);
    post(i + 1);  // the next step's receive overlaps this step's compute
    Tensor in;
    if (posted[i]) {
      in = P2PCommunicator::wait(*posted[i]);
      posted[i].reset();
    }
    const int s = stage_of(st.chunk);
    if (st.pass == Pass::forward) {
      Tensor out = fns.forward(st.chunk, st.microbatch, in);
      ++in_flight;
      stats.max_in_flight = std::max(stats.max_in_flight, in_flight);
      if (memory_in_use) stats.peak_bytes = std::max(stats.peak_bytes, memory_in_use() - base);
      if (s != num_stages - 1) {
        MG_CHECK(out.defined(), "pipeline stage " << s << " produced no output");
        p2p.send(out, next, P2PCommunicator::tag(st.microbatch, s, num_stages, false));
      }
    } else {
      Tensor grad = fns.backward(st.chunk, st.microbatch, in);
      --in_flight;
      if (s != 0) {
        MG_CHECK(grad.defined(), "pipeline stage " << s << " produced no input gradient");
        p2p.send(grad, prev, P2PCommunicator::tag(st.microbatch, s, num_stages, true));
      }
    }
  }
  p2p.wait_sends();
  return stats;
}

namespace {

// Runs `steps` on a model: batches fetched in micro-batch order, activations held per
// (micro-batch, chunk) from forward to backward, the loss on the last virtual stage; then the
// loss sums summed over the pipeline group.
ForwardBackwardResult run_model_pipeline(models::LanguageModule& model,
                                         const NextBatchFn& next_batch, int64_t num_microbatches,
                                         const ForwardBackwardConfig& config,
                                         const models::StepRng& rng,
                                         const std::vector<ScheduleStep>& steps) {
  MG_CHECK(config.pp_group != nullptr && config.pp_group->size() > 1,
           "a pipelined schedule needs ForwardBackwardConfig::pp_group with more than one rank");
  MG_CHECK(config.seq_length > 0 && config.micro_batch_size > 0,
           "a pipelined schedule needs ForwardBackwardConfig::seq_length and micro_batch_size "
           "(the p2p shapes), got "
               << config.seq_length << " and " << config.micro_batch_size);
  const int chunks = model.num_chunks();
  const bool training = !config.forward_only;
  const fp8::Fp8State::WeightCacheScope fp8_weights(model.fp8_state());  // as above
  ForwardBackwardResult r;
  std::map<int64_t, models::Batch> batches;
  int64_t fetched = 0;
  std::map<std::pair<int64_t, int>, std::unique_ptr<models::ForwardState>> states;
  std::map<int64_t, models::LossSums> sums;
  auto batch = [&](int64_t mb) -> const models::Batch& {
    while (fetched <= mb) batches.emplace(fetched++, next_batch());
    return batches.at(mb);
  };
  StageFunctions fns;
  fns.forward = [&](int v, int64_t mb, const Tensor& input) {
    std::unique_ptr<models::ForwardState> st = model.new_forward_state();
    models::LossSums ls;
    const models::Batch& b = batch(mb);
    ScopedTimer t(config.timers, "forward-compute", 2);
    Tensor out =
        model.forward_chunk(v, b, input, *st, {rng.seed, rng.iteration, mb}, training, &ls);
    if (model.chunk(v).post_process) {
      sums[mb] = ls;
      r.num_tokens += ls.num_tokens;
    }
    if (v == chunks - 1) batches.erase(mb);  // the last use of the batch on this rank
    if (training) states.emplace(std::make_pair(mb, v), std::move(st));
    return out;
  };
  fns.backward = [&](int v, int64_t mb, const Tensor& output_grad) {
    auto it = states.find({mb, v});
    MG_CHECK(it != states.end(),
             "backward of micro-batch " << mb << ", chunk " << v << " before its forward");
    // Only a post_process chunk starts from the loss; the others ignore dloss.
    const double dloss =
        model.chunk(v).post_process
            ? loss_backward_seed(config, sums.at(mb).num_tokens, num_microbatches, mb)
            : config.loss_scale;
    ScopedTimer t(config.timers, "backward-compute", 2);
    Tensor dx = model.backward_chunk(*it->second, output_grad, dloss);
    states.erase(it);
    return dx;
  };
  const PipelineRunStats stats = run_pipeline_schedule(
      steps, chunks, *config.pp_group,
      model.pipeline_tensor_shape(config.seq_length, config.micro_batch_size),
      model.pipeline_tensor_dtype(), model.device(), fns, config.memory_in_use);
  MG_CHECK(states.empty(), "pipeline schedule left " << states.size() << " forward(s) without "
                                                     << "backward");
  r.max_in_flight = training ? stats.max_in_flight : 0;
  r.peak_activation_bytes = stats.peak_bytes;
  // The last stage's losses, read once (they stayed on the device), summed in micro-batch order
  // (the order its forwards ran in).
  std::vector<models::LossSums*> pending;
  for (auto& [mb, ls] : sums) pending.push_back(&ls);
  models::resolve_loss_sums(pending);
  for (const auto& [mb, ls] : sums) {
    r.loss_sum += ls.loss_sum;
    r.microbatches.push_back(ls);
  }
  // The loss lives on the last stage: its sums, summed over the pipeline group, on every stage.
  Tensor t = Tensor::from_vector(std::vector<double>{r.loss_sum, r.num_tokens}, {2}, DType::f64);
  config.pp_group->all_reduce(t, comm::ReduceOp::sum)->wait();
  const auto v = t.to_vector<double>();
  r.loss_sum = v[0];
  r.num_tokens = v[1];
  r.lm_loss = r.num_tokens > 0.0 ? r.loss_sum / r.num_tokens : 0.0;
  return r;
}

}  // namespace

ForwardBackwardResult forward_backward_pipelining_without_interleaving(
    models::LanguageModule& model, const NextBatchFn& next_batch, int64_t num_microbatches,
    const ForwardBackwardConfig& config, const models::StepRng& rng) {
  MG_CHECK(model.num_chunks() == 1,
           "the 1F1B schedule runs one model chunk per rank, the model "
           "has "
               << model.num_chunks() << " (use the interleaved schedule)");
  MG_CHECK(config.pp_group != nullptr, "the 1F1B schedule needs ForwardBackwardConfig::pp_group");
  const auto steps = schedule_1f1b(config.pp_group->size(), config.pp_group->rank(),
                                   num_microbatches, config.forward_only);
  return run_model_pipeline(model, next_batch, num_microbatches, config, rng, steps);
}

ForwardBackwardResult forward_backward_pipelining_with_interleaving(
    models::LanguageModule& model, const NextBatchFn& next_batch, int64_t num_microbatches,
    const ForwardBackwardConfig& config, const models::StepRng& rng) {
  MG_CHECK(config.pp_group != nullptr,
           "the interleaved schedule needs ForwardBackwardConfig::pp_group");
  const auto steps =
      schedule_interleaved(config.pp_group->size(), config.pp_group->rank(), model.num_chunks(),
                           num_microbatches, config.forward_only);
  return run_model_pipeline(model, next_batch, num_microbatches, config, rng, steps);
}

ForwardBackwardFunc get_forward_backward_func(int pipeline_model_parallel_size,
                                              int virtual_pipeline_model_parallel_size) {
  MG_CHECK(pipeline_model_parallel_size >= 1,
           "--pipeline-model-parallel-size must be >= 1, got " << pipeline_model_parallel_size);
  if (pipeline_model_parallel_size == 1) return &forward_backward_no_pipelining;
  if (virtual_pipeline_model_parallel_size > 1)
    return &forward_backward_pipelining_with_interleaving;
  return &forward_backward_pipelining_without_interleaving;
}

}  // namespace mg::pipeline_parallel
