// pretrain / train / train_step / evaluate (training.h).
#include "megatron/training/training.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <optional>
#include <span>
#include <sstream>
#include <utility>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/core/datasets/data_samplers.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/models/gpt/gpt_flops.h"
#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/runtime.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/training_log.h"

namespace mg::training {
namespace {

using datasets::DataIterator;
using datasets::DataIteratorOptions;

// Megatron's get_batch; with a context-parallel group also get_batch_on_this_cp_rank: every [B, S]
// tensor cut to this CP rank's chunks r and 2 CP - 1 - r, position ids made explicit first so that
// RoPE and learned positions follow the real positions.
models::GPTBatch to_batch(const datasets::MicroBatch& mb, const comm::ProcessGroup* cp = nullptr) {
  models::GPTBatch b;
  b.tokens = mb.tokens;
  b.labels = mb.labels;
  b.loss_mask = mb.loss_mask;
  b.position_ids = mb.position_ids;
  b.doc_ids = mb.doc_ids;
  if (!cp || cp->size() == 1) return b;
  if (!b.position_ids.defined()) {
    const int64_t rows = b.tokens.size(0), s = b.tokens.size(1);
    std::vector<int64_t> pos(static_cast<std::size_t>(rows * s));
    for (int64_t i = 0; i < rows * s; ++i) pos[static_cast<std::size_t>(i)] = i % s;
    b.position_ids = Tensor::from_vector(pos, {rows, s}, DType::i64);
  }
  for (Tensor* t : {&b.tokens, &b.labels, &b.loss_mask, &b.position_ids, &b.doc_ids})
    if (t->defined()) *t = transformer::slice_sequence_for_cp_rank(*t, cp->rank(), cp->size());
  return b;
}

// The process's communicator, created on first use (--distributed-backend; by default MPI under
// mpirun/srun, else single rank) and kept for the life of the process: MPI may be initialised only
// once. --distributed-timeout-minutes bounds every collective's wait.
comm::Communicator& world_communicator(const Arguments& args) {
  static std::unique_ptr<comm::Communicator> c = [&args] {
    auto p = comm::init_communicator(args.distributed_backend);
    p->set_default_timeout(std::chrono::minutes(args.distributed_timeout_minutes));
    return p;
  }();
  return *c;
}

// Everything a run holds between the phases of pretrain().
struct Run {
  Run(const Arguments& a, std::ostream& l, std::ostream& last, const PretrainHooks& h)
      : args(a), log(l), log_last(last), hooks(h) {}
  const Arguments& args;
  std::ostream& log;       // Megatron's print_rank_0: data-parallel rank 0 only
  std::ostream& log_last;  // print_rank_last (iteration and evaluation lines): the last rank only
  const PretrainHooks& hooks;
  Runtime* rt = nullptr;
  comm::ProcessGroupPtr dp_group;
  comm::ProcessGroupPtr tp_group;  // null without tensor parallelism
  comm::ProcessGroupPtr pp_group;  // null without pipeline parallelism
  // Context parallelism: the CP group, and the pure data-parallel group the data iterator follows
  // (dp_group is then dp-cp: gradients and loss sums); both null without CP.
  comm::ProcessGroupPtr cp_group, data_group;
  // Pipelining with tied embeddings: the first and last stage of this pipeline (null elsewhere).
  comm::ProcessGroupPtr embedding_group;
  pipeline_parallel::PipelineLayout layout;
  comm::ProcessGroupPtr world_group;
  // MoE with expert parallelism (or TP): the expert-model-parallel group, the expert
  // data-parallel group (DDP of expert params) and the expert tp-ep-pp group (grad norm).
  comm::ProcessGroupPtr ep_group, expert_dp_group, expert_mp_group;
  std::unique_ptr<models::GPTModel> model;
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  std::unique_ptr<optimizer::MegatronOptimizer> opt;
  std::unique_ptr<optimizer::OptimizerParamScheduler> scheduler;
  datasets::DatasetSplits splits;
  std::unique_ptr<DataIterator> train_iter, valid_iter;
  int64_t iteration = 0;
  int64_t consumed_train = 0, consumed_valid = 0;
  double flops_so_far = 0.0;
  uint64_t rng_seed = 0;
  int64_t train_iters = 0;
  double flops_per_iter = 0.0;
  Timers timers;
  PretrainResult result;
  int64_t peak_activation_bytes = 0, max_in_flight = 0;  // pipelining, over the run
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

std::unique_ptr<DataIterator> make_iterator(const Run& r, datasets::Split split, int64_t consumed,
                                            bool cyclic) {
  const auto& ds = r.splits[static_cast<std::size_t>(split)];
  if (!ds || ds->size() == 0) return nullptr;
  DataIteratorOptions o;
  o.micro_batch_size = r.args.training.micro_batch_size;
  o.data_parallel_size = r.args.training.data_parallel_size;
  o.data_parallel_rank = (r.data_group ? r.data_group : r.dp_group)->rank();
  o.consumed_samples = cyclic ? consumed % ds->size() : consumed;
  o.cyclic = cyclic;
  if (!cyclic && consumed >= ds->size()) return nullptr;
  return std::make_unique<DataIterator>(ds, o);
}

nlohmann::json given_args_json(const Arguments& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : args.given) j[k] = v;
  return j;
}

CheckpointRanks checkpoint_ranks(const Run& r) {
  CheckpointRanks ranks;
  ranks.group = r.dp_group;
  ranks.tp_group = r.tp_group;
  ranks.world = r.world_group;
  ranks.pp_group = r.pp_group;  // stages hold other (global) names; the tied copy is a replica
  ranks.optimizer_sharded = r.args.ddp.use_distributed_optimizer;
  return ranks;
}

void save(Run& r) {
  const auto& c = r.args.checkpoint;
  CheckpointState st;
  st.iteration = r.iteration;
  st.consumed_train_samples = r.consumed_train;
  st.consumed_valid_samples = r.consumed_valid;
  st.floating_point_operations_so_far = r.flops_so_far;
  st.vocab_size = r.model->vocab_size();
  r.ddp->finish_param_sync();  // --overlap-param-gather: the parameters saved are the updated ones
  if (!c.no_save_optim) {
    st.optimizer = r.opt->state_dict();
    st.scheduler = r.scheduler->state_dict();
  }
  if (!c.no_save_rng) st.rng = nlohmann::json{{"seed", r.rng_seed}};
  st.args = given_args_json(r.args);
  r.timers.start("save-checkpoint");
  SaveOptions so;
  so.format = c.ckpt_format;
  so.async = c.async_save;
  const CheckpointIOStats io =
      save_checkpoint(*c.save, r.model->parameters(), st, checkpoint_ranks(r), so);
  const double s = r.timers.stop("save-checkpoint");
  r.log << "  successfully " << (io.async ? "started saving" : "saved")
        << " checkpoint from iteration " << std::setw(7) << r.iteration << " to " << *c.save
        << " [ t " << std::fixed << std::setprecision(2) << s * 1000.0 << " ms, "
        << io.total_bytes / 1e9 << " GB, " << std::setprecision(3)
        << io.total_bytes / 1e9 / std::max(s, 1e-9) << " GB/s"
        << (io.async ? " to host memory; written in the background" : "") << " ]"
        << std::defaultfloat << std::endl;
  r.result.saved_iteration = r.iteration;
}

void load(Run& r) {
  const auto& c = r.args.checkpoint;
  if (!c.load) return;
  const auto latest = read_latest_iteration(*c.load);
  if (!latest) {
    MG_CHECK(!c.exit_on_missing_checkpoint,
             "--load " << *c.load << " has no checkpoint (" << kTrackerFile
                       << " missing) and --exit-on-missing-checkpoint is set");
    r.log << "WARNING: could not find the metadata file " << *c.load << "/" << kTrackerFile
          << "; will not load any checkpoints and will start from random" << std::endl;
    return;
  }
  LoadOptions o;
  o.load_optimizer = !c.no_load_optim && !c.finetune;
  o.load_rng = !c.no_load_rng && !c.finetune;
  o.format = c.ckpt_format;
  o.auto_detect_format = c.auto_detect_ckpt_format;
  o.vocab_size = r.model->vocab_size();
  if (o.load_optimizer) o.optimizer_template = r.opt->state_dict();
  CheckpointState st = load_checkpoint(*c.load, r.model->parameters(), o, checkpoint_ranks(r));
  if (st.optimizer)
    r.opt->load_state_dict(*st.optimizer);
  else
    r.opt->reload_model_params();
  if (st.scheduler) r.scheduler->load_state_dict(*st.scheduler);
  if (st.rng) r.rng_seed = (*st.rng).at("seed").get<uint64_t>();
  if (!c.finetune) {
    r.iteration = st.iteration;
    r.consumed_train = st.consumed_train_samples;
    r.consumed_valid = st.consumed_valid_samples;
    r.flops_so_far = st.floating_point_operations_so_far;
  }
  r.log << "  successfully loaded checkpoint from " << *c.load << " at iteration " << st.iteration
        << (c.finetune ? " (--finetune: starting at iteration 0)" : "") << " [" << st.format;
  if (st.io_seconds > 0)
    r.log << ", " << std::fixed << std::setprecision(2) << st.io_seconds * 1000.0 << " ms, "
          << std::setprecision(3) << st.io_bytes / 1e9 / st.io_seconds << " GB/s read by this rank"
          << std::defaultfloat;
  r.log << "]" << std::endl;
}

// "a 1\nb 2\n..." -> "\n  a=1, b=2, ..." wrapped at about 100 columns.
std::string wrap_config(const std::string& lines) {
  std::istringstream in(lines);
  std::string line, out, cur;
  while (std::getline(in, line)) {
    const auto sp = line.find(' ');
    const std::string item =
        sp == std::string::npos ? line : line.substr(0, sp) + "=" + line.substr(sp + 1);
    if (!cur.empty() && cur.size() + item.size() > 96) out += "\n  " + cur, cur.clear();
    cur += (cur.empty() ? "" : ", ") + item;
  }
  if (!cur.empty()) out += "\n  " + cur;
  return out;
}

// "data parallel: ..." (a line) when there is more than one rank or a DDP option is on.
std::string data_parallel_summary(const Run& r) {
  const auto& d = r.args.ddp;
  if (r.dp_group->size() == 1 && !d.use_distributed_optimizer && !d.overlap_grad_reduce) return "";
  std::ostringstream s;
  s << "data parallel: " << r.dp_group->size() << " ranks (" << r.dp_group->backend() << "), "
    << r.ddp->buckets().size() << " gradient bucket(s)"
    << (d.use_distributed_optimizer ? ", distributed optimizer" : "")
    << (d.overlap_grad_reduce ? ", overlap-grad-reduce" : "") << "\n";
  return s.str();
}

// "tensor parallel: ..." (a line) with TP > 1.
std::string tensor_parallel_summary(const Run& r) {
  if (!r.tp_group) return "";
  std::ostringstream s;
  s << "tensor parallel: " << r.tp_group->size() << " ranks, sequence parallel "
    << (r.args.sequence_parallel ? "on" : "off") << ", padded vocab "
    << r.model->padded_vocab_size() << "\n";
  return s.str();
}

// "pipeline parallel: ..." (a line) with PP > 1.
std::string pipeline_parallel_summary(const Run& r) {
  if (!r.pp_group) return "";
  std::ostringstream s;
  s << "pipeline parallel: " << r.layout.str() << "; "
    << (r.layout.vp > 1 ? "interleaved 1F1B" : "1F1B") << " schedule, "
    << r.args.training.num_microbatches() << " micro-batches"
    << (r.embedding_group ? ", tied embedding summed over the first and last stage" : "") << "\n";
  return s.str();
}

// "context parallel: ..." (a line) with CP > 1. The data-parallel line counts the DP x CP ranks
// its gradients are reduced over; this one gives the data-parallel size itself.
std::string context_parallel_summary(const Run& r) {
  if (!r.cp_group) return "";
  std::ostringstream s;
  s << "context parallel: " << r.cp_group->size() << " ranks (" << r.args.cp_comm_type
    << "), data-parallel size " << r.args.training.data_parallel_size << "\n";
  return s.str();
}

void print_summary(Run& r, const tokenizers::Tokenizer& tok) {
  const auto& m = *r.model;
  auto& plat = *r.rt->platform;
  r.log << "------------------------ Megatron-CPP pretrain_gpt ------------------------\n"
        << "platform: " << plat.name() << ", device " << device_summary(*r.rt)
        << (r.args.deterministic_mode ? ", deterministic mode" : "") << "\n"
        << "tokenizer: " << tok.name() << ", vocab " << tok.vocab_size() << " (padded "
        << m.padded_vocab_size() << ")\n"
        << " > number of parameters: " << m.num_parameters() << "\n"
        << "model config:" << wrap_config(m.config().str()) << "\n"
        << "training: micro batch " << r.args.training.micro_batch_size << ", global batch "
        << r.args.training.global_batch_size << " (" << r.args.training.num_microbatches()
        << " micro-batches), " << r.train_iters << " iterations, seed " << r.args.training.seed
        << "\n"
        << data_parallel_summary(r) << tensor_parallel_summary(r) << pipeline_parallel_summary(r)
        << context_parallel_summary(r) << "optimizer: " << r.args.optimizer.optimizer << ", lr "
        << *r.args.optimizer.lr << " (" << r.args.scheduler.lr_decay_style << "), weight decay "
        << r.args.optimizer.weight_decay << ", clip-grad " << r.args.optimizer.clip_grad
        << ", params " << dtype_name(r.args.model.params_dtype) << "\n"
        << "op table (" << plat.name() << "):";
  int col = 0;
  for (const auto& res : r.rt->registry->resolutions(plat.name())) {
    if (col++ % 3 == 0) r.log << "\n ";
    std::ostringstream cell;
    cell << res.slot << "=" << (res.provider.empty() ? "MISSING" : res.provider);
    r.log << " " << std::left << std::setw(40) << cell.str() << std::right;
  }
  r.log << "\n----------------------------------------------------------------------------"
        << std::endl;
}

// Megatron's loss reporting: (loss sum, token count) summed over the data-parallel group.
std::pair<double, double> reduce_loss(Run& r, double loss_sum, double num_tokens) {
  if (r.dp_group->size() == 1) return {loss_sum, num_tokens};
  Tensor t = Tensor::from_vector(std::vector<double>{loss_sum, num_tokens}, {2}, DType::f64);
  r.dp_group->all_reduce(t, comm::ReduceOp::sum)->wait();
  const auto v = t.to_vector<double>();
  return {v[0], v[1]};
}

// Megatron's get_forward_backward_func for this run's layout.
pipeline_parallel::ForwardBackwardFunc forward_backward(const Run& r) {
  return pipeline_parallel::get_forward_backward_func(r.layout.pp, r.layout.vp);
}

// The pipeline fields of a schedule config (p2p shapes, peak activation memory).
void set_pipeline(Run& r, pipeline_parallel::ForwardBackwardConfig& cfg) {
  if (!r.pp_group) return;
  cfg.pp_group = r.pp_group.get();
  // Each CP rank holds 2 of the sequence's 2 x CP chunks (get_batch_on_this_cp_rank).
  cfg.seq_length = r.args.model.seq_length / r.args.context_parallel_size;
  cfg.micro_batch_size = r.args.training.micro_batch_size;
  cfg.memory_in_use = [&r] {
    return static_cast<int64_t>(r.rt->platform->memory_stats(r.rt->device.index).allocated_bytes);
  };
}

// Pipelining with tied embeddings: the first stage's word embedding and the last stage's copy
// get the sum of both grads (Megatron's _allreduce_word_embedding_grads), BEFORE the data-parallel
// reduce: after a ZeRO reduce-scatter each copy's valid shard lies at a different offset
// (PITFALLS #4).
void allreduce_embedding_grads(Run& r) {
  if (!r.embedding_group || r.embedding_group->size() == 1) return;
  Tensor g = r.model->parameter("embedding.word_embeddings.weight").main_grad;
  r.embedding_group->all_reduce(g, comm::ReduceOp::sum)->wait();
}

// Megatron's evaluate(): eval_iters iterations of gbs samples, forward only.
std::optional<double> evaluate(Run& r, DataIterator* it, int64_t* consumed) {
  if (!it || r.args.training.eval_iters == 0) return std::nullopt;
  double loss_sum = 0.0, tokens = 0.0;
  const int64_t n_mb = r.args.training.num_microbatches();
  for (int64_t i = 0; i < r.args.training.eval_iters; ++i) {
    pipeline_parallel::ForwardBackwardConfig cfg;
    cfg.forward_only = true;
    auto next = [&] {
      auto mb = it->next();
      MG_CHECK(mb.has_value(), "evaluation data ran out");
      return to_batch(*mb, r.cp_group.get());
    };
    set_pipeline(r, cfg);
    auto fb =
        forward_backward(r)(*r.model, next, n_mb, cfg, models::StepRng{r.rng_seed, r.iteration, 0});
    const auto [sum, n] = reduce_loss(r, fb.loss_sum, fb.num_tokens);
    loss_sum += sum;
    tokens += n;
    if (consumed) *consumed += r.args.training.global_batch_size;
  }
  return tokens > 0 ? loss_sum / tokens : 0.0;
}

struct StepOutcome {
  double lm_loss = 0.0;
  double grad_norm = 0.0;
  std::optional<int64_t> num_zeros_in_grad;  // --log-num-zeros-in-grad
  bool skipped = false;
  bool nan = false;
  double lr = 0.0;
};

// Megatron's train_step.
StepOutcome train_step(Run& r) {
  const auto& a = r.args;
  StepOutcome out;
  r.ddp->zero_grad_buffer();
  const bool dp = r.dp_group->size() > 1;
  pipeline_parallel::ForwardBackwardConfig cfg;
  cfg.calculate_per_token_loss = a.model.calculate_per_token_loss;
  cfg.loss_scale = r.opt->loss_scale();
  // MoE aux/z losses: Megatron's MoEAuxLossAutoScaler.set_loss_scale (the lm loss's seed scale).
  transformer::moe::MoEAuxLossAutoScaler::set_loss_scale(
      cfg.calculate_per_token_loss
          ? cfg.loss_scale
          : cfg.loss_scale / static_cast<double>(a.training.num_microbatches()));
  // Data parallel with per-token loss: DDP sums the grads; they are divided by the global token
  // count below (Megatron's finalize_model_grads).
  cfg.finalize_per_token_grads = !dp;
  if (a.ddp.overlap_grad_reduce)
    cfg.set_is_last_microbatch = [&r](bool last) { r.ddp->set_is_last_microbatch(last); };
  auto next = [&] {
    auto mb = r.train_iter->next();
    MG_CHECK(mb.has_value(), "training data ran out at iteration " << r.iteration + 1);
    return to_batch(*mb, r.cp_group.get());
  };
  set_pipeline(r, cfg);
  // Pipelining: DDP launches nothing from the grad-ready hook (a chunk's last micro-batch is not
  // the schedule's); finish_grad_sync reduces every bucket after the embedding-group sum.
  if (r.pp_group) r.ddp->set_is_last_microbatch(false);
  auto fb = forward_backward(r)(*r.model, next, a.training.num_microbatches(), cfg,
                                models::StepRng{r.rng_seed, r.iteration, 0});
  r.peak_activation_bytes = std::max(r.peak_activation_bytes, fb.peak_activation_bytes);
  r.max_in_flight = std::max(r.max_in_flight, fb.max_in_flight);
  allreduce_embedding_grads(r);
  if (r.pp_group) r.ddp->set_is_last_microbatch(true);
  r.ddp->finish_grad_sync();
  // Sequence parallelism: norm weights / SP-region biases summed over TP (Megatron's
  // finalize_model_grads, after the DP reduce; with the distributed optimizer only this rank's
  // shard of them is used).
  if (r.tp_group && a.sequence_parallel)
    tensor_parallel::all_reduce_sequence_parallel_grads(r.model->parameters(), *r.tp_group);
  out.lm_loss = fb.lm_loss;
  if (dp) {
    const auto [sum, tokens] = reduce_loss(r, fb.loss_sum, fb.num_tokens);
    out.lm_loss = tokens > 0.0 ? sum / tokens : 0.0;
    if (cfg.calculate_per_token_loss) {
      MG_CHECK(tokens > 0.0, "calculate_per_token_loss: the global batch has no unmasked token");
      Tensor grads = r.model->buffer().grads;
      Tensor none;
      r.model->ops().multi_tensor_scale(std::span<Tensor>(&grads, 1), 1.0 / tokens, none);
    }
  }
  if (r.hooks.after_forward_backward)
    r.hooks.after_forward_backward(r.iteration, out.lm_loss, *r.model);
  out.nan = !std::isfinite(out.lm_loss);
  out.lr = r.scheduler->lr();
  if (out.nan && !a.optimizer.fp16) {
    MG_CHECK(!a.training.check_for_nan_in_loss_and_grad,
             "lm loss is " << out.lm_loss << " at iteration " << r.iteration + 1 << " (lr "
                           << out.lr
                           << "); stopping (Megatron's --check-for-nan-in-loss-and-grad). Lower "
                              "--lr, raise --clip-grad protection, or pass "
                              "--no-check-for-nan-in-loss-and-grad to skip such steps");
    out.skipped = true;  // do not let NaN gradients reach the weights
    return out;
  }
  const optimizer::StepResult s = r.opt->step(out.lr, r.scheduler->weight_decay());
  out.skipped = !s.success;
  out.grad_norm = s.grad_norm;
  out.num_zeros_in_grad = s.num_zeros_in_grad;
  // Megatron: increment = num_microbatches * mbs * dp = the global batch, in samples.
  if (s.success) r.scheduler->step(a.training.global_batch_size);
  return out;
}

std::optional<double> mem_mb(Run& r, bool peak) {
  auto st = r.rt->platform->memory_stats(r.rt->device.index);
  const double b = static_cast<double>(peak ? st.peak_allocated_bytes : st.allocated_bytes);
  return b / (1024.0 * 1024.0);
}

void train(Run& r) {
  const auto& a = r.args;
  const auto& tr = a.training;
  const int64_t tokens_per_iter = tr.global_batch_size * a.model.seq_length;
  std::optional<double> peak = a.logging.peak_tflops;
  if (!peak)
    peak = default_peak_tflops(r.rt->platform->capabilities(r.rt->device.index).device_name);

  double interval_loss = 0.0;
  int64_t interval_count = 0, interval_iters = 0, interval_skipped = 0, interval_nan = 0;
  std::optional<double> last_grad_norm;
  std::optional<int64_t> last_num_zeros;
  double last_lr = 0.0;
  r.timers.start("interval-time");
  r.timers.start("train");
  while (r.iteration < r.train_iters) {
    StepOutcome o = train_step(r);
    ++r.iteration;
    r.consumed_train += tr.global_batch_size;
    r.flops_so_far += r.flops_per_iter;
    r.result.train_losses.push_back(o.lm_loss);
    r.result.grad_norms.push_back(o.skipped ? 0.0 : o.grad_norm);
    ++interval_iters;
    last_lr = o.lr;
    if (o.skipped) ++interval_skipped, ++r.result.skipped_iters;
    if (o.nan) ++interval_nan, ++r.result.nan_iters;
    if (!o.skipped && !o.nan) {
      interval_loss += o.lm_loss;
      ++interval_count;
      last_grad_norm = o.grad_norm;
      last_num_zeros = o.num_zeros_in_grad;
    }

    if (r.iteration % a.logging.log_interval == 0) {
      r.rt->platform->synchronize(r.rt->device.index);
      const double secs = r.timers.elapsed("interval-time");
      IntervalStats s;
      s.iteration = r.iteration;
      s.train_iters = r.train_iters;
      s.consumed_samples = r.consumed_train;
      s.elapsed_ms_per_iter = secs * 1000.0 / static_cast<double>(interval_iters);
      s.flops_per_iter = r.flops_per_iter;
      s.tokens_per_iter = tokens_per_iter;
      s.world_size = r.world_group->size();  // every rank (TP x PP x DP) is a GPU
      s.peak_tflops = peak;
      s.learning_rate = last_lr;
      s.global_batch_size = tr.global_batch_size;
      if (interval_count > 0) s.lm_loss = interval_loss / static_cast<double>(interval_count);
      s.loss_scale = r.opt->loss_scale();
      s.grad_norm = last_grad_norm;
      s.num_zeros_in_grad = last_num_zeros;
      s.skipped_iters = interval_skipped;
      s.nan_iters = interval_nan;
      s.mem_allocated_mb = mem_mb(r, false);
      s.mem_max_allocated_mb = mem_mb(r, true);
      // MoE: load-balancing / z losses and tokens per expert (a collective over the world).
      const auto moe = transformer::moe::moe_metrics_log(
          r.world_group.get(), r.model->config(),
          a.sequence_parallel ? a.tensor_model_parallel_size : 1, interval_iters);
      r.log_last << format_training_log(s) << moe.inline_part << "\n"
                 << moe.layer_lines << std::flush;
      interval_loss = 0.0;
      interval_count = interval_iters = interval_skipped = interval_nan = 0;
    }

    if (r.iteration % tr.eval_interval == 0 && r.valid_iter) {
      auto v = evaluate(r, r.valid_iter.get(), &r.consumed_valid);
      if (v) {
        r.result.valid_loss = v;
        r.log_last << format_evaluation(
                          "validation loss at iteration " + std::to_string(r.iteration), *v)
                   << std::endl;
      }
      r.timers.elapsed("interval-time");  // evaluation time is not training time
    }

    const auto& c = a.checkpoint;
    bool saved = false;
    if (c.save && c.save_interval && r.iteration % *c.save_interval == 0) {
      save(r);
      saved = true;
      r.timers.elapsed("interval-time");
    }
    std::string exit_reason;
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count() / 60.0;
    if (tr.exit_duration_in_mins && minutes > *tr.exit_duration_in_mins)
      exit_reason = "exit-duration";
    if (tr.exit_interval && r.iteration % *tr.exit_interval == 0) exit_reason = "exit-interval";
    if (!exit_reason.empty()) {
      if (c.save && !saved) save(r);
      r.log << " exiting program at iteration " << r.iteration << " (" << exit_reason << ")"
            << std::endl;
      r.result.exit_reason = exit_reason;
      break;
    }
  }
  r.timers.stop("interval-time");
  r.result.train_seconds = r.timers.stop("train");
  if (r.result.exit_reason.empty()) r.result.exit_reason = "train-iters";
}

}  // namespace

PretrainResult pretrain(const Arguments& given_args, std::ostream& out_log,
                        const PretrainHooks& hooks) {
  // Data parallelism: dp = the DP group's size (world / TP; no PP/CP yet);
  // gbs defaults to mbs * dp and must divide by it (Megatron's validate_args).
  // Tensor parallelism: Megatron's groups for ParallelDims{tp, dp = world / tp}; the DP group is
  // dp-cp (cp = 1). Without TP the whole world (or the hook's group) is the DP group.
  // Pipeline parallelism: Megatron's groups for {tp, pp, dp = world / (tp pp)}; this rank builds
  // the layers of its stage (layer_layout.h), the embedding group ties the first and last stage.
  const int32_t tp = given_args.tensor_model_parallel_size;
  const int32_t pp = given_args.pipeline_model_parallel_size;
  const auto layout = pipeline_parallel::make_pipeline_layout(
      given_args.model.num_layers, pp, given_args.virtual_pipeline_model_parallel_size,
      std::nullopt, given_args.decoder_first_pipeline_num_layers,
      given_args.decoder_last_pipeline_num_layers);
  comm::ProcessGroupPtr dp_group, tp_group, world_group, pp_group, embedding_group;
  const int32_t cp = given_args.context_parallel_size;
  comm::ProcessGroupPtr cp_group, data_group;                        // context parallelism (CP > 1)
  comm::ProcessGroupPtr ep_group, expert_dp_group, expert_mp_group;  // MoE (EP > 1 or TP > 1)
  const bool expert_groups =
      given_args.model.num_moe_experts > 0 && (given_args.expert_model_parallel_size > 1 || tp > 1);
  if (tp > 1 || pp > 1 || cp > 1 || expert_groups) {
    MG_CHECK(!hooks.data_parallel_group, "--tensor-model-parallel-size "
                                             << tp << " / --pipeline-model-parallel-size " << pp
                                             << ": PretrainHooks::data_parallel_group is "
                                                "for pure data parallelism only");
    auto& comm = world_communicator(given_args);
    parallel_state::ParallelDims dims;
    dims.tp = tp;
    dims.pp = pp;
    if (given_args.model.num_moe_experts > 0) {
      dims.ep = given_args.expert_model_parallel_size;
      dims.etp = 1;
    }
    dims.cp = cp;
    MG_CHECK(comm.world_size() % (tp * pp * cp) == 0,
             "world size " << comm.world_size() << " must be divisible by "
                           << "--tensor-model-parallel-size " << tp
                           << " x --pipeline-model-parallel-size " << pp
                           << " x --context-parallel-size " << cp);
    MG_CHECK(comm.world_size() % (tp * pp) == 0,
             "world size " << comm.world_size() << " must be divisible by "
                           << "--tensor-model-parallel-size " << tp
                           << " x --pipeline-model-parallel-size " << pp);
    auto groups = parallel_state::make_process_groups(comm, dims.resolved(comm.world_size()));
    dp_group = groups.dp_cp;
    if (cp > 1) {
      cp_group = groups.cp;
      data_group = groups.dp;
    }
    if (tp > 1) tp_group = groups.tp;
    world_group = groups.world;
    if (given_args.model.num_moe_experts > 0) {
      ep_group = groups.ep;
      expert_dp_group = groups.expert_dp;
      expert_mp_group = groups.tp_ep_pp;
    }
    if (pp > 1) {
      pp_group = groups.pp;
      if (!given_args.model.untie_embeddings_and_output_weights) embedding_group = groups.embedding;
    }
  } else {
    dp_group = hooks.data_parallel_group ? hooks.data_parallel_group
                                         : world_communicator(given_args).world();
    world_group = dp_group;
  }
  Arguments args = given_args;
  {
    auto& tr = args.training;
    tr.data_parallel_size = dp_group->size() / cp;  // dp_group is dp-cp
    bool gbs_given = false;
    for (const auto& [flag, values] : args.given) gbs_given |= flag == "--global-batch-size";
    if (!gbs_given) tr.global_batch_size = tr.micro_batch_size * tr.data_parallel_size;
    MG_CHECK(tr.global_batch_size % (tr.micro_batch_size * tr.data_parallel_size) == 0,
             "--global-batch-size "
                 << tr.global_batch_size << " must be a multiple of --micro-batch-size "
                 << tr.micro_batch_size << " x data-parallel size " << tr.data_parallel_size);
    args.scheduler.global_batch_size = tr.global_batch_size;
    // The bucket NaN check (before the collective) only where a NaN gradient cannot be a normal
    // event: under fp16 an overflow (inf/nan grads) is the loss scaler's, which skips the step.
    // One rank: the loss check of train_step reports it as before.
    args.ddp.check_for_nan_in_grad =
        tr.check_for_nan_in_loss_and_grad && tr.data_parallel_size > 1 && !args.optimizer.fp16;
    args.ddp.calculate_per_token_loss = args.model.calculate_per_token_loss;
  }
  std::ostream null_log(nullptr);
  const bool first = world_group->rank() == 0,
             last = world_group->rank() == world_group->size() - 1;
  std::ostream& log = first ? out_log : null_log;
  Run r(args, log, last ? out_log : null_log, hooks);
  r.dp_group = dp_group;
  r.tp_group = tp_group;
  r.world_group = world_group;
  r.ep_group = ep_group;
  r.expert_dp_group = expert_dp_group;
  r.expert_mp_group = expert_mp_group;
  r.pp_group = pp_group;
  r.cp_group = cp_group;
  r.data_group = data_group;
  r.embedding_group = embedding_group;
  r.layout = layout;
  if (pp > 1) {
    // Megatron's check: the micro-batches the schedule needs.
    if (layout.vp > 1)
      pipeline_parallel::check_interleaved_microbatches(pp, args.training.num_microbatches());
  }
  if (args.sequence_parallel_disabled)
    log << "WARNING: Disabling sequence parallelism because tensor model parallelism is disabled "
           "(--sequence-parallel needs --tensor-model-parallel-size > 1)"
        << std::endl;
  RuntimeOptions ro;
  ro.platform = args.platform;
  ro.deterministic = args.deterministic_mode;
  r.rt = &mg::init(ro);
  plugin::set_deterministic_mode(args.deterministic_mode);  // this run's (init keeps its first)
  if (args.deterministic_mode)
    check_deterministic_mode(world_group->backend(), world_group->size(), std::getenv("NCCL_ALGO"));
  r.rng_seed = args.training.seed;
  r.train_iters = args.training.total_iters();

  // A missing or malformed --load is an error before any work (with --exit-on-missing-checkpoint).
  if (args.checkpoint.load && args.checkpoint.exit_on_missing_checkpoint)
    MG_CHECK(read_latest_iteration(*args.checkpoint.load).has_value(),
             "--load " << *args.checkpoint.load << " has no checkpoint (" << kTrackerFile
                       << " missing) and --exit-on-missing-checkpoint is set");

  // Tokenizer, then the data config it completes (validated before any heavy work).
  auto tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  datasets::DataConfig data = args.data;
  data.eod_id = tokenizer->eod();
  data.vocab_size = tokenizer->vocab_size();
  data.validate();

  // Model, optimizer, scheduler; then the checkpoint.
  if (tp_group || pp_group || ep_group || cp_group) {
    models::GPTModelParallel par;
    par.tp_group = tp_group.get();
    par.sequence_parallel = args.sequence_parallel;
    if (ep_group && ep_group->size() > 1) par.ep_group = ep_group.get();
    if (cp_group) par.cp = {cp_group.get(), transformer::parse_cp_comm_type(args.cp_comm_type)};
    if (pp_group) par.pipeline_chunks = layout.chunks(pp_group->rank());
    r.model = std::make_unique<models::GPTModel>(
        args.model, tokenizer->vocab_size(), *r.rt->ops, r.rt->device,
        models::get_gpt_layer_with_transformer_engine_spec(args.model), par);
  } else {
    r.model = std::make_unique<models::GPTModel>(args.model, tokenizer->vocab_size(), *r.rt->ops,
                                                 r.rt->device);
  }
  r.model->init_weights(args.training.seed);
  r.ddp = std::make_unique<distributed::DistributedDataParallel>(
      args.ddp, r.model->parameters(), r.model->buffer(), *r.rt->ops, dp_group, expert_dp_group);
  if (args.ddp.overlap_grad_reduce)
    r.model->set_grad_ready_hook([&r](std::size_t i) { r.ddp->param_grad_ready(i); });
  std::optional<optimizer::ShardOptions> shard;
  if (args.ddp.use_distributed_optimizer) {
    shard.emplace();
    shard->ranges = r.ddp->optimizer_shard_ranges();
    shard->group = dp_group;
    // --overlap-param-gather: the all-gathers run during the next forward, each bucket waited
    // for by the model's param-use hook just before its parameters are first used.
    const bool overlap_gather = args.ddp.overlap_param_gather;
    shard->gather_params = [&r, overlap_gather] {
      r.ddp->start_param_sync();
      if (!overlap_gather) r.ddp->finish_param_sync();
    };
    if (overlap_gather)
      r.model->set_param_use_hook(
          [&r](std::span<const std::size_t> idx) { r.ddp->wait_param_gather(idx); });
  }
  r.opt = std::make_unique<optimizer::MegatronOptimizer>(
      args.optimizer, r.model->parameters(), r.model->buffer(), *r.rt->ops,
      optimizer::ParamGroupOptions{}, std::move(shard));
  if (tp_group) r.opt->set_tensor_parallel_group(tp_group);
  if (expert_mp_group) r.opt->set_expert_parallel_group(expert_mp_group);
  if (pp_group) r.opt->set_pipeline_parallel_group(pp_group);
  r.scheduler = std::make_unique<optimizer::OptimizerParamScheduler>(
      optimizer::scheduler_config_from_args(args.scheduler));
  r.flops_per_iter = models::num_floating_point_operations(
      r.model->config(), r.model->padded_vocab_size(), args.training.global_batch_size);
  print_summary(r, *tokenizer);
  if (args.model.num_moe_experts > 0) {
    const auto& m = args.model;
    log << "mixture of experts: " << m.num_moe_experts << " experts, top-" << m.moe_router_topk
        << " " << transformer::to_string(m.moe_router_score_function) << " router, "
        << transformer::to_string(m.moe_router_load_balancing_type) << " (coeff "
        << m.moe_aux_loss_coeff << "), dispatcher "
        << transformer::to_string(m.moe_token_dispatcher_type) << ", expert parallel "
        << args.expert_model_parallel_size << " ("
        << m.num_moe_experts / args.expert_model_parallel_size
        << " experts per rank), expert data parallel "
        << (expert_dp_group ? expert_dp_group->size() : dp_group->size())
        << (m.moe_expert_capacity_factor
                ? ", capacity factor " + std::to_string(*m.moe_expert_capacity_factor) + " (" +
                      transformer::to_string(m.moe_token_drop_policy) + ")"
                : std::string(", dropless"))
        << std::endl;
  }
  load(r);

  // Data: Megatron's split sizes, iterators from the checkpoint's position.
  log << "> building train, validation, and test datasets ..." << std::endl;
  const auto sizes = datasets::megatron_split_sizes(
      args.training.train_iters.value_or(r.train_iters), args.training.global_batch_size,
      args.training.eval_interval, args.training.eval_iters, args.training.train_samples);
  r.splits = datasets::BlendedMegatronDatasetBuilder(data, sizes).build();
  for (auto s : datasets::kSplits) {
    const auto& ds = r.splits[static_cast<std::size_t>(s)];
    log << "    " << datasets::split_name(s) << ": "
        << (ds ? std::to_string(ds->size()) + " samples (" + std::string(ds->class_name()) + ")"
               : std::string("none"))
        << std::endl;
  }
  if (r.iteration < r.train_iters && !args.training.skip_train) {
    r.train_iter = make_iterator(r, datasets::Split::train, r.consumed_train, false);
    MG_CHECK(r.train_iter, "there is no training data (the train split is empty)");
  }
  r.valid_iter = make_iterator(r, datasets::Split::valid, r.consumed_valid, true);

  const int64_t start_iteration = r.iteration;
  if (!args.training.skip_train && r.iteration < r.train_iters) {
    log << "> training ..." << std::endl;
    train(r);
  }
  r.ddp->finish_param_sync();  // --overlap-param-gather: the last step's gather
  r.train_iter.reset();

  // After training: validation and test (Megatron's evaluate_and_print_results), final save.
  if (r.valid_iter && r.iteration % args.training.eval_interval != 0) {
    if (auto v = evaluate(r, r.valid_iter.get(), &r.consumed_valid)) {
      r.result.valid_loss = v;
      r.log_last << format_evaluation("validation loss at iteration " +
                                          std::to_string(r.iteration) + " on validation set",
                                      *v)
                 << std::endl;
    }
  }
  if (auto test_iter = make_iterator(r, datasets::Split::test, 0, true)) {
    if (auto v = evaluate(r, test_iter.get(), nullptr)) {
      r.result.test_loss = v;
      r.log_last << format_evaluation(
                        "test loss at iteration " + std::to_string(r.iteration) + " on test set",
                        *v)
                 << std::endl;
    }
  }
  const auto& c = args.checkpoint;
  if (c.save && r.iteration > start_iteration && r.result.saved_iteration != r.iteration) save(r);
  if (finalize_async_save()) r.log << "  finished the background checkpoint save" << std::endl;
  r.result.iteration = r.iteration;
  r.result.consumed_train_samples = r.consumed_train;
  return r.result;
}

void check_deterministic_mode(std::string_view backend, int world_size, const char* nccl_algo) {
  if (backend != "nccl" || world_size == 1) return;
  static constexpr const char* kAlgos[] = {"Tree", "Ring", "CollnetDirect", "CollnetChain",
                                           "^NVLS"};
  bool ok = false;
  for (const char* a : kAlgos) ok |= nccl_algo != nullptr && std::string_view(nccl_algo) == a;
  std::ostringstream got;
  if (nccl_algo)
    got << "'" << nccl_algo << "'";
  else
    got << "unset";
  MG_CHECK(ok,
           "--deterministic-mode with NCCL needs NCCL_ALGO set to one of Tree, Ring, "
           "CollnetDirect, CollnetChain, ^NVLS (got "
               << got.str() << ")");
}

}  // namespace mg::training
