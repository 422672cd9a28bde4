// pretrain / train / train_step / evaluate (training.h).
#include "megatron/training/training.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <optional>
#include <sstream>
#include <utility>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/core/datasets/data_samplers.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/distributed/parallelize.h"
#include "megatron/core/models/gpt/gpt_flops.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/runtime.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/initialize.h"
#include "megatron/training/model_provider.h"
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

// Everything a run holds between the phases of pretrain().
struct Run {
  Run(const Arguments& a, std::ostream& l, std::ostream& last, const PretrainHooks& h,
      ParallelState&& p)
      : args(a), log(l), log_last(last), hooks(h), ps(std::move(p)) {}
  const Arguments& args;
  std::ostream& log;       // Megatron's print_rank_0: data-parallel rank 0 only
  std::ostream& log_last;  // print_rank_last (iteration and evaluation lines): the last rank only
  const PretrainHooks& hooks;
  Runtime* rt = nullptr;
  std::string attention_backend_line;  // --attention-backend: what runs (start-up summary)
  // Declared before the model and its wrappers: their collectives need the groups until the end.
  ParallelState ps;
  std::unique_ptr<models::LanguageModule> model;  // the schedules' and DDP's interface
  distributed::DataParallelModel dp_model;        // DDP (and the ZeRO shard) around `model`
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
  AsyncCheckpointSaver checkpoint_saver;  // --async-save: the save being written in the background
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

std::unique_ptr<DataIterator> make_iterator(const Run& r, datasets::Split split, int64_t consumed,
                                            bool cyclic) {
  const auto& ds = r.splits[static_cast<std::size_t>(split)];
  if (!ds || ds->size() == 0) return nullptr;
  DataIteratorOptions o;
  o.micro_batch_size = r.args.training.micro_batch_size;
  o.data_parallel_size = r.args.training.data_parallel_size;
  o.data_parallel_rank = r.ps.data_iterator_group()->rank();
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
  ranks.group = r.ps.dp;
  ranks.tp_group = r.ps.tp;
  ranks.world = r.ps.world;
  ranks.pp_group = r.ps.pp;  // stages hold other (global) names; the tied copy is a replica
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
  r.dp_model.ddp
      ->finish_param_sync();  // --overlap-param-gather: the parameters saved are the updated ones
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
  const CheckpointIOStats io = save_checkpoint(*c.save, r.model->parameters(), st,
                                               checkpoint_ranks(r), so, &r.checkpoint_saver);
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
  if (r.ps.dp->size() == 1 && !d.use_distributed_optimizer && !d.overlap_grad_reduce) return "";
  std::ostringstream s;
  s << "data parallel: " << r.ps.dp->size() << " ranks (" << r.ps.dp->backend() << "), "
    << r.dp_model.ddp->buckets().size() << " gradient bucket(s)"
    << (d.use_distributed_optimizer ? ", distributed optimizer" : "")
    << (d.overlap_grad_reduce ? ", overlap-grad-reduce" : "") << "\n";
  return s.str();
}

// "tensor parallel: ..." (a line) with TP > 1.
std::string tensor_parallel_summary(const Run& r) {
  if (!r.ps.tp) return "";
  std::ostringstream s;
  s << "tensor parallel: " << r.ps.tp->size() << " ranks, sequence parallel "
    << (r.args.parallel.sequence_parallel ? "on" : "off") << ", padded vocab "
    << r.model->padded_vocab_size() << "\n";
  return s.str();
}

// "pipeline parallel: ..." (a line) with PP > 1.
std::string pipeline_parallel_summary(const Run& r) {
  if (!r.ps.pp) return "";
  std::ostringstream s;
  s << "pipeline parallel: " << r.ps.layout.str() << "; "
    << (r.ps.layout.vp > 1 ? "interleaved 1F1B" : "1F1B") << " schedule, "
    << r.args.training.num_microbatches() << " micro-batches"
    << (r.ps.embedding ? ", tied embedding summed over the first and last stage" : "") << "\n";
  return s.str();
}

// "context parallel: ..." (a line) with CP > 1. The data-parallel line counts the DP x CP ranks
// its gradients are reduced over; this one gives the data-parallel size itself.
std::string context_parallel_summary(const Run& r) {
  if (!r.ps.cp) return "";
  std::ostringstream s;
  s << "context parallel: " << r.ps.cp->size() << " ranks (" << r.args.parallel.cp_comm_type
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
        << r.attention_backend_line << "\n"
        << "op table (" << plat.name() << "):";
  int col = 0;
  for (const auto& res : r.rt->resolutions()) {
    if (col++ % 3 == 0) r.log << "\n ";
    std::ostringstream cell;
    cell << res.slot << "=" << (res.provider.empty() ? "MISSING" : res.provider);
    r.log << " " << std::left << std::setw(40) << cell.str() << std::right;
  }
  r.log << "\n----------------------------------------------------------------------------"
        << std::endl;
}

// Megatron's get_forward_backward_func for this run's layout.
pipeline_parallel::ForwardBackwardFunc forward_backward(const Run& r) {
  return pipeline_parallel::get_forward_backward_func(r.ps.layout.pp, r.ps.layout.vp);
}

// The pipeline fields of a schedule config (p2p shapes, peak activation memory).
void set_pipeline(Run& r, pipeline_parallel::ForwardBackwardConfig& cfg) {
  if (!r.ps.pp) return;
  cfg.pp_group = r.ps.pp.get();
  // Each CP rank holds 2 of the sequence's 2 x CP chunks (get_batch_on_this_cp_rank).
  cfg.seq_length = r.args.model.seq_length / r.args.parallel.context_parallel_size;
  cfg.micro_batch_size = r.args.training.micro_batch_size;
  cfg.memory_in_use = [&r] {
    return static_cast<int64_t>(r.rt->platform->memory_stats(r.rt->device.index).allocated_bytes);
  };
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
      return to_batch(*mb, r.ps.cp.get());
    };
    set_pipeline(r, cfg);
    auto fb =
        forward_backward(r)(*r.model, next, n_mb, cfg, models::StepRng{r.rng_seed, r.iteration, 0});
    const models::LossSums global =
        distributed::reduce_loss_sums({fb.loss_sum, fb.num_tokens}, r.ps.dp.get());
    loss_sum += global.loss_sum;
    tokens += global.num_tokens;
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

// Megatron's train_step: schedule -> finalize_model_grads -> optimizer.
StepOutcome train_step(Run& r) {
  const auto& a = r.args;
  StepOutcome out;
  distributed::DistributedDataParallel& ddp = *r.dp_model.ddp;
  ddp.zero_grad_buffer();
  pipeline_parallel::ForwardBackwardConfig cfg;
  cfg.calculate_per_token_loss = a.model.calculate_per_token_loss;
  cfg.loss_scale = r.opt->loss_scale();
  r.model->moe_state().aux_loss_auto_scaler.set_loss_scale(
      pipeline_parallel::aux_loss_scale(cfg, a.training.num_microbatches()));
  // Megatron's no_sync: DDP launches a bucket's reduction from the grad-ready hook only in the
  // last micro-batch's backward. Pipelining: none at all (a chunk's last micro-batch is not the
  // schedule's); finalize_model_grads reduces every bucket after the embedding-group sum.
  if (a.ddp.overlap_grad_reduce)
    cfg.set_is_last_microbatch = [&ddp](bool last) { ddp.set_is_last_microbatch(last); };
  if (r.ps.pp) ddp.set_is_last_microbatch(false);
  auto next = [&] {
    auto mb = r.train_iter->next();
    MG_CHECK(mb.has_value(), "training data ran out at iteration " << r.iteration + 1);
    return to_batch(*mb, r.ps.cp.get());
  };
  set_pipeline(r, cfg);
  auto fb = forward_backward(r)(*r.model, next, a.training.num_microbatches(), cfg,
                                models::StepRng{r.rng_seed, r.iteration, 0});
  r.peak_activation_bytes = std::max(r.peak_activation_bytes, fb.peak_activation_bytes);
  r.max_in_flight = std::max(r.max_in_flight, fb.max_in_flight);
  distributed::FinalizeModelGradsConfig fin;
  fin.ddp = &ddp;
  fin.dp_group = r.ps.dp.get();
  fin.tp_group = r.ps.tp.get();
  fin.sequence_parallel = a.parallel.sequence_parallel;
  fin.embedding_group = r.ps.embedding.get();
  fin.calculate_per_token_loss = cfg.calculate_per_token_loss;
  const models::LossSums global =
      distributed::finalize_model_grads(*r.model, fin, {fb.loss_sum, fb.num_tokens});
  out.lm_loss = global.num_tokens > 0.0 ? global.loss_sum / global.num_tokens : 0.0;
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
      s.world_size = r.ps.world->size();  // every rank (TP x PP x DP) is a GPU
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
          r.model->moe_state().metrics_tracker, r.ps.world.get(), r.model->config(),
          a.parallel.sequence_parallel ? a.parallel.tensor_model_parallel_size : 1, interval_iters);
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

// The stages of a run, in Megatron's order: initialise the parallel state -> model_provider ->
// the data-parallel wrapping (parallelize) -> the optimizer and scheduler -> the checkpoint ->
// data -> the loop.
PretrainResult pretrain(const Arguments& given_args, std::ostream& out_log,
                        const PretrainHooks& hooks) {
  // 1. The parallel state: communicator, Megatron's process groups, the pipeline layout; then the
  //    flags that depend on the data-parallel size.
  ParallelState ps = initialize_model_parallel(given_args);
  const Arguments args = complete_arguments(given_args, ps);
  std::ostream null_log(nullptr);
  const bool first = ps.world->rank() == 0, last = ps.world->rank() == ps.world->size() - 1;
  std::ostream& log = first ? out_log : null_log;
  Run r(args, log, last ? out_log : null_log, hooks, std::move(ps));
  if (args.parallel.sequence_parallel_disabled)
    log << "WARNING: Disabling sequence parallelism because tensor model parallelism is disabled "
           "(--sequence-parallel needs --tensor-model-parallel-size > 1)"
        << std::endl;
  RuntimeOptions ro;
  ro.platform = args.platform;
  ro.deterministic = args.deterministic_mode;
  r.rt = &mg::init(ro);  // this run's Runtime: its op table is resolved for ro.deterministic
  {
    // --attention-backend: the attention providers this run prefers, from those the platform has.
    auto all_of = [&](ops::OpId id) {
      const auto res = r.rt->resolutions()[static_cast<std::size_t>(id)];
      std::vector<std::string> v;
      if (!res.provider.empty()) v.push_back(res.provider);
      for (const auto* list : {&res.fallbacks, &res.shadowed, &res.excluded})
        v.insert(v.end(), list->begin(), list->end());
      return v;
    };
    const AttentionBackendChoice choice = choose_attention_backend(
        args.attention_backend, r.rt->platform->name(), all_of(ops::OpId::attention_fwd),
        all_of(ops::OpId::attention_bwd), args.deterministic_mode, plugin::op_providers_from_env());
    r.attention_backend_line = choice.summary;
    if (!choice.providers.empty()) {
      ro.op_providers = choice.providers;
      r.rt = &mg::init(ro);
    }
  }
  if (args.deterministic_mode)
    check_deterministic_mode(r.ps.world->backend(), r.ps.world->size(), std::getenv("NCCL_ALGO"));
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

  // 2. The model: this rank's share of it, initialised from --seed.
  r.model = model_provider(args.model, tokenizer->vocab_size(), *r.rt->ops, r.rt->device,
                           model_parallel_options(args, r.ps));
  r.model->init_weights(args.training.seed);
  // 3. The data-parallel wrapping: DDP over the gradient buffer (and the distributed optimizer's
  //    shard).
  r.dp_model = distributed::parallelize(*r.model, args.ddp, r.ps.dp, r.ps.expert_dp);
  // 4. The optimizer and the LR scheduler.
  r.opt = std::make_unique<optimizer::MegatronOptimizer>(
      args.optimizer, r.model->parameters(), r.model->buffer(), *r.rt->ops,
      optimizer::ParamGroupOptions{}, std::move(r.dp_model.optimizer_shard),
      optimizer::GradStatsGroups{.tp = r.ps.tp, .pp = r.ps.pp, .expert = r.ps.expert_mp});
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
        << args.parallel.expert_model_parallel_size << " ("
        << m.num_moe_experts / args.parallel.expert_model_parallel_size
        << " experts per rank), expert data parallel "
        << (r.ps.expert_dp ? r.ps.expert_dp->size() : r.ps.dp->size())
        << (m.moe_expert_capacity_factor
                ? ", capacity factor " + std::to_string(*m.moe_expert_capacity_factor) + " (" +
                      transformer::to_string(m.moe_token_drop_policy) + ")"
                : std::string(", dropless"))
        << std::endl;
  }
  // 5. The checkpoint (model; optimizer, scheduler, RNG and data position unless told not to).
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
  r.dp_model.ddp->finish_param_sync();  // --overlap-param-gather: the last step's gather
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
  if (r.checkpoint_saver.finalize())
    r.log << "  finished the background checkpoint save" << std::endl;
  r.result.iteration = r.iteration;
  r.result.consumed_train_samples = r.consumed_train;
  return r.result;
}

AttentionBackendChoice choose_attention_backend(const std::string& backend,
                                                std::string_view platform,
                                                const std::vector<std::string>& fwd,
                                                const std::vector<std::string>& bwd,
                                                bool deterministic,
                                                const std::map<std::string, std::string>& env) {
  auto has = [](const std::vector<std::string>& v, const std::string& name) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("none") : s;
  };
  const std::string cudnn_bwd = deterministic ? "cuda:cudnn-deterministic" : "cuda:cudnn";
  const bool cudnn = has(fwd, "cuda:cudnn") && has(bwd, cudnn_bwd);
  AttentionBackendChoice c;
  std::string what;
  auto prefer = [&](const std::string& f, const std::string& b) {
    if (!env.count("attention_fwd")) c.providers["attention_fwd"] = f;
    if (!env.count("attention_bwd")) c.providers["attention_bwd"] = b;
  };
  if (backend == "fused" || (backend == "auto" && cudnn)) {
    MG_CHECK(cudnn, "--attention-backend fused: no cuDNN fused attention on platform '"
                        << platform << "' (providers 'cuda:cudnn' / '" << cudnn_bwd
                        << "'; a CUDA build that found the cuDNN frontend and libcudnn has them: "
                           "scripts/install_deps.sh); its attention_fwd providers: "
                        << join(fwd) << "; use --attention-backend auto or local");
    prefer("cuda:cudnn", cudnn_bwd);
    const auto version =
        reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_version"));
    what = "cuDNN fused attention" + (version ? " (" + std::string(version()) + ")" : "") +
           (deterministic ? ", deterministic backward" : "") +
           "; calls it does not serve (dropout, document masks, causal with Sk < Sq, f32, other "
           "head dims) run our kernels";
  } else if (backend == "unfused" && has(fwd, "cuda:attention-rows") &&
             has(bwd, "cuda:attention-rows")) {
    prefer("cuda:attention-rows", "cuda:attention-rows");
    what = "our reference kernel (one query row per block)";
  } else if (backend == "unfused") {
    what = "our reference kernel (the platform's attention kernel)";
  } else {
    what = std::string("our kernels") +
           (backend == "auto"
                ? " (no cuDNN fused attention on platform '" + std::string(platform) + "')"
                : "");
  }
  c.summary = "attention backend: " + backend + " -> " + what;
  for (const char* slot : {"attention_fwd", "attention_bwd"})
    if (env.count(slot))
      c.summary += "; MG_OP_PROVIDERS sets " + std::string(slot) + "=" + env.at(slot);
  return c;
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
