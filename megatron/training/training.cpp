// pretrain / train / train_step / evaluate (training.h).
#include "megatron/training/training.h"

#include <dlfcn.h>
#include <sys/resource.h>

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
#include "megatron/core/common/host_sync.h"
#include "megatron/core/common/progress.h"
#include "megatron/core/datasets/data_samplers.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/distributed/parallelize.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_flops.h"
#include "megatron/core/ops/op_profiler.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"
#include "megatron/core/optimizer/optimizer_state.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/plugin/registry.h"
#include "megatron/runtime.h"
#include "megatron/training/checkpoint_model.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/initialize.h"
#include "megatron/training/memory_estimate.h"
#include "megatron/training/model_provider.h"
#include "megatron/training/monitoring.h"
#include "megatron/training/reliability.h"
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
  // --profile / --profile-op-table on this rank: the model and optimizer call its table (declared
  // before them: it outlives them). profile_out: this rank's log (a profiled rank may not be 0).
  std::unique_ptr<ops::OpProfiler> profiler;
  std::ostream* profile_out = nullptr;
  HostSyncCounts profile_syncs;  // host round-trips inside the profiled steps
  // Device work submitted inside the profiled steps (Platform::launch_counts differences).
  plugin::Platform::LaunchCounts profile_launches;
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
  // The loaded checkpoint's "extra" (e.g. convert_checkpoint's HF identity: model type, config,
  // tokenizer files), written again into every checkpoint this run saves.
  nlohmann::json checkpoint_extra = nlohmann::json::object();
  int64_t train_iters = 0;
  double flops_per_iter = 0.0;
  Timers timers;
  PretrainResult result;
  int64_t peak_activation_bytes = 0, max_in_flight = 0;  // pipelining, over the run
  AsyncCheckpointSaver checkpoint_saver;  // --async-save: the save being written in the background
  std::unique_ptr<Monitoring> monitor;    // TensorBoard, timers, signals, stragglers
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  // The op table the model and optimizer call: the profiler's on a profiled rank.
  const ops::OpTable& ops() const { return profiler ? profiler->table() : *rt->ops; }
};

std::unique_ptr<DataIterator> make_iterator(const Run& r, datasets::Split split, int64_t consumed,
                                            bool cyclic) {
  const auto& ds = r.splits[static_cast<std::size_t>(split)];
  if (!ds || ds->size() == 0) return nullptr;
  DataIteratorOptions o;
  o.micro_batch_size = r.args.training.micro_batch_size;
  o.data_parallel_size = r.args.training.data_parallel_size;
  o.data_parallel_rank = r.ps.data_iterator_group()->rank();
  // --dataloader-type cyclic: Megatron's random sampler for every split (it counts consumed
  // samples across epochs itself).
  o.random = r.args.training.dataloader_type == "cyclic";
  o.consumed_samples = o.random ? consumed : cyclic ? consumed % ds->size() : consumed;
  o.cyclic = cyclic || o.random;
  // --num-workers: collating threads, each two micro-batches ahead (PyTorch's prefetch_factor).
  o.num_workers = static_cast<int>(r.args.training.num_workers);
  o.prefetch_depth = 2 * o.num_workers;
  if (!o.cyclic && consumed >= ds->size()) return nullptr;
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

// Nothing non-finite is saved: every rank checks its parameters and optimizer state (one
// l2_norm_sq pass), all agree, and a NaN/inf refuses the save before the tracker moves.
void check_finite_before_save(Run& r, const CheckpointState& st) {
  std::vector<Tensor> ts = {r.model->buffer().params};
  if (st.optimizer)
    for (const auto& [k, t] : st.optimizer->tensors) ts.push_back(t);
  const double bad = optimizer::detail::all_reduce_scalar(
      r.ps.world.get(), all_finite(*r.rt->ops, ts) ? 0.0 : 1.0, comm::ReduceOp::max);
  if (bad == 0.0) return;
  std::string where = "another rank";
  if (auto p = first_nonfinite_parameter(r.model->parameters(), false))
    where = "parameter '" + *p + "'";
  else if (auto k = st.optimizer ? first_nonfinite_state(*st.optimizer) : std::nullopt)
    where = "optimizer state '" + *k + "'";
  const auto latest = read_latest_iteration(*r.args.checkpoint.save);
  MG_THROW("refusing to save iteration "
           << r.iteration << " to " << *r.args.checkpoint.save << ": " << where
           << " holds NaN/inf values; the tracker stays at "
           << (latest ? "iteration " + std::to_string(*latest) : std::string("no checkpoint"))
           << " (the run diverged: lower --lr, check the data, or resume from the last good "
              "checkpoint)");
}

// Every rank's FP8 state (fp8/fp8_state.h) merged by linear (and FP8 attention) name: the pipeline
// stages hold other layers; TP and DP replicas agree (the amax reduction), and the lowest rank wins
// where they do not (--tp-only-amax-red), as Megatron keeps data-parallel rank 0's extra state.
// Collective over the world.
nlohmann::json gather_fp8_state(Run& r) {
  comm::ProcessGroup& w = *r.ps.world;
  const std::string mine = r.model->fp8_state()->state_json().dump();
  if (w.size() == 1) return nlohmann::json::parse(mine);
  const auto ws = static_cast<int64_t>(w.size());
  Tensor len = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::empty({ws}, DType::i64);
  w.all_gather(lens, len)->wait();
  int64_t longest = 0;
  for (int64_t l : lens.to_vector<int64_t>()) longest = std::max(longest, l);
  Tensor buf = Tensor::zeros({longest}, DType::u8);
  std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
  Tensor all = Tensor::empty({ws * longest}, DType::u8);
  w.all_gather(all, buf)->wait();
  nlohmann::json merged;
  const std::vector<int64_t> l = lens.to_vector<int64_t>();
  for (int64_t k = 0; k < ws; ++k) {
    const char* p = reinterpret_cast<const char*>(all.data<uint8_t>() + k * longest);
    nlohmann::json j = nlohmann::json::parse(std::string(p, static_cast<std::size_t>(l[k])));
    if (merged.is_null()) {
      merged = j;
      continue;
    }
    for (const char* group : {"linears", "attentions"}) {
      if (!j.contains(group)) continue;
      for (auto& [name, v] : j.at(group).items())
        if (!merged[group].contains(name)) merged[group][name] = v;
    }
  }
  return merged;
}

// Every rank's router expert biases (--moe-router-enable-expert-bias) by Megatron's name
// ("decoder.layers.N.mlp.router.expert_bias"): the pipeline stages hold other layers, the other
// ranks of a stage the same values (the update sums over tp-dp-cp), the lowest rank's kept.
// Collective over the world.
nlohmann::json gather_expert_bias(Run& r) {
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [name, v] : r.model->moe_state().expert_bias_state()) mine[name] = v;
  comm::ProcessGroup& w = *r.ps.world;
  if (w.size() == 1) return mine;
  const std::string text = mine.dump();
  const auto ws = static_cast<int64_t>(w.size());
  Tensor len = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1});
  Tensor lens = Tensor::empty({ws}, DType::i64);
  w.all_gather(lens, len)->wait();
  int64_t longest = 0;
  for (int64_t l : lens.to_vector<int64_t>()) longest = std::max(longest, l);
  Tensor buf = Tensor::zeros({longest}, DType::u8);
  std::copy(text.begin(), text.end(), buf.data<uint8_t>());
  Tensor all = Tensor::empty({ws * longest}, DType::u8);
  w.all_gather(all, buf)->wait();
  nlohmann::json merged = nlohmann::json::object();
  const std::vector<int64_t> l = lens.to_vector<int64_t>();
  for (int64_t k = 0; k < ws; ++k) {
    const char* p = reinterpret_cast<const char*>(all.data<uint8_t>() + k * longest);
    const nlohmann::json j = nlohmann::json::parse(std::string(p, static_cast<std::size_t>(l[k])));
    for (auto& [name, v] : j.items())
      if (!merged.contains(name)) merged[name] = v;
  }
  return merged;
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
  // --fp8-param-gather: the FP8 parameters are saved dequantised in the model dtype (Megatron's
  // checkpoints of Float8Tensor weights), so any run, FP8 or not, loads them.
  if (r.model->fp8_state() && r.model->fp8_state()->param_gather())
    r.model->fp8_state()->dequantize_params(r.model->parameters());
  if (!c.no_save_optim) {
    st.optimizer = r.opt->state_dict();
    st.scheduler = r.scheduler->state_dict();
  }
  if (!c.no_save_rng) st.rng = nlohmann::json{{"seed", r.rng_seed}};
  st.args = given_args_json(r.args);
  st.extra = r.checkpoint_extra;  // the HF identity of an imported model travels on
  check_finite_before_save(r, st);
  if (r.model->fp8_state()) st.extra["fp8"] = gather_fp8_state(r);  // amax histories and scales
  if (r.args.model.moe_router_enable_expert_bias)
    st.extra["moe_expert_bias"] = gather_expert_bias(r);
  r.timers.start("save-checkpoint");
  SaveOptions so;
  so.format = c.ckpt_format;
  so.async = c.async_save;
  so.checksums = c.ckpt_checksum;
  const CheckpointIOStats io = save_checkpoint(*c.save, r.model->parameters(), st,
                                               checkpoint_ranks(r), so, &r.checkpoint_saver);
  r.dp_model.ddp->reshard_params();  // FSDP optim_grads_params: the gathered copies go again
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

// --fp8-param-gather (docs/fp8.md): this rank's master shards cast to the FP8 parameters
// (Fp8State::quantize_param_shards over the data-parallel group; tensorwise also over TP).
void quantize_fp8_params(Run& r) {
  std::vector<fp8::MasterShard> shards;
  for (const auto& m : r.opt->master_shards())
    shards.push_back(fp8::MasterShard{m.param, m.offset, m.master});
  r.model->fp8_state()->quantize_param_shards(shards, r.ps.dp.get(), r.ps.tp.get());
}

// The FP8 parameters from the master weights, gathered: before the first step (Transformer
// Engine's fp8_model_init casts the initial weights) and after a checkpoint load (the masters
// and the weights' scales are the checkpoint's, so the bytes are those of the saving run).
void init_fp8_params(Run& r) {
  if (!r.model->fp8_state() || !r.model->fp8_state()->param_gather()) return;
  quantize_fp8_params(r);
  r.dp_model.ddp->start_param_sync();
  r.dp_model.ddp->finish_param_sync();
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
  // Strict load: the model flags recorded in the checkpoint must be this run's.
  const auto mismatches = checkpoint_model_mismatches(read_checkpoint_metadata(*c.load, latest),
                                                      r.args, r.model->vocab_size());
  if (!mismatches.empty()) {
    std::string list;
    for (const auto& m : mismatches) list += "\n  " + m;
    MG_CHECK(c.allow_ckpt_model_mismatch,
             "--load " << *c.load << " (iteration " << *latest
                       << ") holds a model built with other flags; loading it would silently "
                          "change the model:"
                       << list
                       << "\nPass the checkpoint's values, or --allow-ckpt-model-mismatch to "
                          "load it anyway");
    r.log << "WARNING: --allow-ckpt-model-mismatch: loading " << *c.load
          << " although its model flags differ:" << list << std::endl;
  }
  LoadOptions o;
  o.load_optimizer = !c.no_load_optim && !c.finetune;
  o.load_rng = !c.no_load_rng && !c.finetune;
  o.format = c.ckpt_format;
  o.auto_detect_format = c.auto_detect_ckpt_format;
  o.vocab_size = r.model->vocab_size();
  o.verify_checksums = c.ckpt_checksum;
  if (o.load_optimizer) o.optimizer_template = r.opt->state_dict();
  CheckpointState st = load_checkpoint(*c.load, r.model->parameters(), o, checkpoint_ranks(r));
  if (st.optimizer)
    r.opt->load_state_dict(*st.optimizer);
  else
    r.opt->reload_model_params();
  r.dp_model.ddp->reshard_params();  // FSDP optim_grads_params: keep only this rank's chunks
  if (st.scheduler) r.scheduler->load_state_dict(*st.scheduler);
  // FP8 amax histories and scales (a run without FP8 ignores them: loading into BF16 works; a
  // checkpoint without them starts FP8 from fresh state, as Transformer Engine does).
  if (r.model->fp8_state() && st.extra.contains("fp8"))
    r.model->fp8_state()->load_state_json(st.extra.at("fp8"));
  // Router expert biases (a checkpoint without them, e.g. one trained without the flag, starts
  // them at zero, said once).
  if (r.args.model.moe_router_enable_expert_bias) {
    const int64_t n =
        st.extra.contains("moe_expert_bias")
            ? r.model->moe_state().load_expert_bias_state(
                  st.extra.at("moe_expert_bias").get<std::map<std::string, std::vector<float>>>())
            : 0;
    if (n < static_cast<int64_t>(r.model->moe_state().expert_bias.size()))
      r.log << "WARNING: --moe-router-enable-expert-bias: " << *c.load << " holds "
            << (st.extra.contains("moe_expert_bias") ? "not every" : "no")
            << " router expert bias of this stage; the missing ones start at zero" << std::endl;
  }
  if (st.rng) r.rng_seed = (*st.rng).at("seed").get<uint64_t>();
  r.checkpoint_extra = st.extra;
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
  std::ostringstream s;
  if (r.ps.dp->size() > 1 || d.use_distributed_optimizer || d.overlap_grad_reduce ||
      d.use_megatron_fsdp)
    s << "data parallel: " << r.ps.dp->size() << " ranks (" << r.ps.dp->backend() << "), "
      << r.dp_model.ddp->buckets().size() << " gradient bucket(s)"
      << (d.use_distributed_optimizer ? ", distributed optimizer" : "")
      << (d.use_megatron_fsdp ? std::string(", Megatron FSDP ") + to_string(d.sharding_strategy)
                              : std::string())
      << (d.overlap_grad_reduce ? ", overlap-grad-reduce" : "")
      << (d.overlap_param_gather ? ", overlap-param-gather" : "") << "\n";
  const Tensor& grads = r.model->buffer().grads;
  if (d.use_megatron_fsdp && d.shards_grads() && !grads.is_host()) {
    const plugin::Platform::SparseMemoryInfo info = plugin::global_registry()
                                                        .platform(grads.device().type)
                                                        .sparse_memory_info(grads.device().index);
    s << (info.releases ? "FSDP: discarded ranges free device memory ("
                        : "FSDP: discarded ranges do NOT free device memory (")
      << info.note << ")\n";
  }
  if (r.args.use_torch_fsdp2)
    s << "note: --use-torch-fsdp2 runs the Megatron FSDP engine with optim_grads_params\n";
  if (r.args.optimizer.optimizer_cpu_offload && r.opt->offloaded_numel() == 0)
    s << "optimizer CPU offload (fraction " << r.args.optimizer.optimizer_offload_fraction
      << "): the identity on " << r.rt->platform->name()
      << ", whose optimizer state and update are in host memory already\n";
  else if (r.args.optimizer.optimizer_cpu_offload)
    s << "optimizer CPU offload (fraction " << r.args.optimizer.optimizer_offload_fraction
      << "): " << r.opt->offloaded_numel() << " optimizer elements of this rank in "
      << format_bytes(static_cast<double>(r.opt->host_state_bytes()))
      << " of pinned host memory, stepped by the cpu platform's adamw_step; "
      << format_bytes(static_cast<double>(r.opt->state_bytes())) << " of optimizer state on "
      << r.rt->platform->name() << "\n";
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

// "fp8: ..." (a line) with --fp8-format.
std::string fp8_summary(Run& r) {
  const fp8::Fp8State* st = r.model->fp8_state();
  if (!st) return "";
  const fp8::Fp8Config& f = st->config();
  std::ostringstream s;
  s << "fp8: format " << fp8::format_name(f.format) << " (forward " << dtype_name(f.forward_dtype())
    << ", gradients " << dtype_name(f.backward_dtype()) << "), recipe "
    << fp8::recipe_name(f.recipe);
  if (f.recipe == fp8::Fp8Recipe::delayed)
    s << " (amax history " << f.amax_history_len << ", " << fp8::amax_algo_name(f.amax_compute_algo)
      << ", margin " << f.margin << ", amax reduced over " << (r.ps.amax ? r.ps.amax->size() : 1)
      << " rank(s))";
  s << ", " << st->num_linears() << " FP8 linears"
    << (f.dot_product_attention
            ? " and " + std::to_string(st->num_attentions()) + " FP8 core attentions" +
                  (f.multi_head_attention
                       ? std::string(" (multi-head: O and dO in FP8 at linear_proj)")
                       : std::string()) +
                  (f.dot_product_attention_fp8_backward
                       ? std::string()
                       : std::string(" (backward in the model dtype: NVTE_FP8_DPA_BWD=0)"))
            : std::string())
    << " on this rank"
    << (f.first_last_layers_bf16
            ? ", first " + std::to_string(f.num_layers_at_start_in_bf16) + " / last " +
                  std::to_string(f.num_layers_at_end_in_bf16) + " layers in high precision"
            : std::string())
    << (f.wgrad ? "" : ", wgrad in high precision");
  const transformer::TransformerConfig& m = r.args.model;
  if (m.activation == transformer::Activation::swiglu && m.bias_swiglu_fusion && f.wgrad)
    s << ", SwiGLU fused into the casts ("
      << (m.add_bias_linear ? "forward only: linear_fc1 has a bias" : "forward and backward")
      << ")";
  s << "\n";
  if (f.param_gather) {  // the FP8 parameters and the buckets that gather them as bytes
    int64_t elems = 0, buckets = 0;
    for (const fp8::ParamRun& run : st->param_runs()) elems += run.end - run.start;
    for (const auto& b : r.dp_model.ddp->buckets()) buckets += b.fp8 ? 1 : 0;
    s << "fp8 parameters (--fp8-param-gather): " << elems << " elements in "
      << st->param_runs().size() << " run(s), " << dtype_name(f.forward_dtype())
      << " (1 byte each), all-gathered in " << buckets << " bucket(s) of their own over "
      << r.ps.dp->size() << " data-parallel rank(s)\n";
  }
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
        << context_parallel_summary(r) << fp8_summary(r)
        << "optimizer: " << r.args.optimizer.optimizer << ", lr " << *r.args.optimizer.lr << " ("
        << r.args.scheduler.lr_decay_style << "), weight decay " << r.args.optimizer.weight_decay
        << ", clip-grad " << r.args.optimizer.clip_grad << ", params "
        << dtype_name(r.args.model.params_dtype) << "\n"
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
        distributed::reduce_loss_sums({fb.loss_sum, fb.num_tokens, nullptr}, r.ps.dp.get());
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
  r.model->moe_state().aux_loss_auto_scaler.set_loss_scale(pipeline_parallel::aux_loss_scale(
      cfg, a.training.num_microbatches(), a.parallel.context_parallel_size));
  // Megatron's no_sync: DDP launches a bucket's reduction from the grad-ready hook only in the
  // last micro-batch's backward. Pipelining: none at all (a chunk's last micro-batch is not the
  // schedule's); finalize_model_grads reduces every bucket after the embedding-group sum.
  if (a.ddp.overlap_grad_reduce)
    cfg.set_is_last_microbatch = [&ddp](bool last) { ddp.set_is_last_microbatch(last); };
  if (r.ps.pp) ddp.set_is_last_microbatch(false);
  ddp.set_pipelined(r.ps.pp != nullptr);
  Monitoring& mon = *r.monitor;
  auto next = [&] {
    ScopedTimer t(&mon.timers(), "batch-generator", 2);
    const auto t0 = std::chrono::steady_clock::now();
    auto mb = r.train_iter->next();
    MG_CHECK(mb.has_value(), "training data ran out at iteration " << r.iteration + 1);
    auto b = to_batch(*mb, r.ps.cp.get());
    mon.straggler().add_batch_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return b;
  };
  set_pipeline(r, cfg);
  cfg.timers = &mon.timers();
  mon.start_forward_backward();
  mon.straggler().start_compute();
  auto fb = forward_backward(r)(*r.model, next, a.training.num_microbatches(), cfg,
                                models::StepRng{r.rng_seed, r.iteration, 0});
  mon.straggler().stop_compute();
  mon.timers().stop("forward-backward");
  r.peak_activation_bytes = std::max(r.peak_activation_bytes, fb.peak_activation_bytes);
  r.max_in_flight = std::max(r.max_in_flight, fb.max_in_flight);
  distributed::FinalizeModelGradsConfig fin;
  fin.ddp = &ddp;
  fin.dp_group = r.ps.dp.get();
  fin.tp_group = r.ps.tp.get();
  fin.sequence_parallel = a.parallel.sequence_parallel;
  fin.embedding_group = r.ps.embedding.get();
  fin.calculate_per_token_loss = cfg.calculate_per_token_loss;
  fin.timers = &mon.timers();
  const models::LossSums global =
      distributed::finalize_model_grads(*r.model, fin, {fb.loss_sum, fb.num_tokens, nullptr});
  // Megatron's _update_router_expert_bias (in its finalize_model_grads): aux-loss-free balancing.
  if (a.model.moe_router_enable_expert_bias)
    r.model->moe_state().update_expert_biases(r.ps.expert_bias.get(),
                                              a.model.moe_router_bias_update_rate);
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
  mon.timers().start("optimizer", 1);
  const optimizer::StepResult s = r.opt->step(out.lr, r.scheduler->weight_decay());
  mon.timers().stop("optimizer");
  // A non-finite grad norm with a finite loss: the optimizer did not apply it (bf16/fp32; fp16's
  // overflows are the scaler's). Stop, naming the first parameter with a non-finite gradient.
  if (s.found_inf && !a.optimizer.fp16) {
    out.nan = true;
    // The diagnostic below reads every gradient: FSDP's released device ranges are backed first.
    if (a.training.check_for_nan_in_loss_and_grad) r.dp_model.ddp->commit_all_grads();
    MG_CHECK(!a.training.check_for_nan_in_loss_and_grad,
             "grad norm is " << s.grad_norm << " at iteration " << r.iteration + 1 << " (lm loss "
                             << out.lm_loss << ", lr " << out.lr
                             << "); the step was not applied; first parameter with a non-finite "
                                "gradient on this rank: "
                             << first_nonfinite_parameter(r.model->parameters(), true)
                                    .value_or("none (another rank holds it)")
                             << "; stopping (Megatron's --check-for-nan-in-loss-and-grad; "
                                "--no-check-for-nan-in-loss-and-grad skips such steps)");
  }
  out.skipped = !s.success;
  out.grad_norm = s.grad_norm;
  out.num_zeros_in_grad = s.num_zeros_in_grad;
  // Megatron: increment = num_microbatches * mbs * dp = the global batch, in samples.
  if (s.success) r.scheduler->step(a.training.global_batch_size);
  return out;
}

// This process's peak resident set size (getrusage; Linux reports KiB).
double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

std::optional<double> mem_mb(Run& r, bool peak) {
  auto st = r.rt->platform->memory_stats(r.rt->device.index);
  const double b = static_cast<double>(peak ? st.peak_allocated_bytes : st.allocated_bytes);
  return b / (1024.0 * 1024.0);
}

// --profile / --profile-op-table: a profiler on the ranks of --profile-ranks, wrapping the run's op
// table (so the model and optimizer are built on its table), and a start-up line saying what runs.
void setup_profiler(Run& r, std::ostream& out_log) {
  const LoggingConfig& lg = r.args.logging;
  if (!lg.profiling()) return;
  const int world = r.ps.world->size(), rank = r.ps.world->rank();
  bool mine = false;
  std::ostringstream ranks;
  for (int64_t p : lg.profile_ranks) {
    MG_CHECK(p < world, "--profile-ranks " << p << " is not a rank of this run (world size "
                                           << world << ": 0.." << world - 1 << ")");
    mine = mine || p == rank;
    ranks << (ranks.tellp() > 0 ? " " : "") << p;
  }
  const std::string_view tool = r.rt->platform->profiling_tool();
  r.log << "profiling: iterations [" << lg.profile_step_start << ", " << lg.profile_step_end
        << ") on rank(s) " << ranks.str() << ":"
        << (lg.profile ? std::string(" --profile ") +
                             (tool.empty() ? std::string("(platform ") +
                                                 std::string(r.rt->platform->name()) +
                                                 " has no timeline tool: no ranges recorded)"
                                           : std::string(tool))
                       : std::string())
        << (lg.profile_op_table
                ? " --profile-op-table (each op timed by platform events, read once at the end; "
                  "the table and the host round-trips per step are printed by each profiled rank)"
                : "")
        << std::endl;
  if (!mine) return;
  r.profiler = std::make_unique<ops::OpProfiler>(
      *r.rt->ops, *r.rt->platform, r.rt->device,
      ops::OpProfilerOptions{.time_ops = lg.profile_op_table, .ranges = lg.profile});
  std::array<std::string, ops::kNumOps> providers;
  const auto res = r.rt->resolutions();
  for (std::size_t i = 0; i < providers.size() && i < res.size(); ++i)
    providers[i] = res[i].provider;
  r.profiler->set_providers(std::move(providers));
  r.profile_out = &out_log;
}

// The end of the profiled window: the capture range closes; with --profile-op-table this rank
// prints the table (one wait for the device here) and its host round-trips per step.
void finish_profile(Run& r) {
  r.profiler->stop();
  if (!r.profiler->options().time_ops) return;
  const ops::OpProfileReport rep = r.profiler->report();
  std::ostream& os = *r.profile_out;
  const double steps = static_cast<double>(std::max<int64_t>(rep.steps, 1));
  os << "op profile (--profile-op-table), rank " << r.ps.world->rank() << ", platform "
     << rep.platform << ", " << rep.steps << " step(s) ending at iteration " << r.iteration << ", "
     << std::fixed << std::setprecision(3) << rep.step_ms / steps << " ms/step:\n"
     << std::defaultfloat << ops::format_op_profile(rep)
     << "host round-trips per step: " << r.profile_syncs.str(steps) << "\n";
  const plugin::Platform::LaunchCounts& l = r.profile_launches;
  if (l.counted)
    os << "kernel launches per step: " << std::fixed << std::setprecision(1)
       << static_cast<double>(l.kernels) / steps << " of the platform's kernels + "
       << static_cast<double>(l.library_calls) / steps
       << " vendor-library calls (GEMMs, fused attention; each may launch more than one kernel)"
       << std::defaultfloat << std::endl;
  else
    os << "kernel launches per step: not counted (platform " << rep.platform
       << " runs its ops on host threads)" << std::endl;
  r.profile_syncs = HostSyncCounts{};
  r.profile_launches = plugin::Platform::LaunchCounts{};
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
  int64_t fp16_skips_at_min = 0;
  std::optional<double> last_grad_norm;
  std::optional<int64_t> last_num_zeros;
  double last_lr = 0.0;
  r.timers.start("interval-time");
  r.timers.start("train");
  const auto& lg = a.logging;
  while (r.iteration < r.train_iters) {
    // --profile / --profile-op-table: iterations [start, end) (Megatron's window).
    const bool profiled =
        r.profiler && r.iteration >= lg.profile_step_start && r.iteration < lg.profile_step_end;
    if (profiled) {
      r.profiler->start();
      r.profiler->begin_step();
    }
    const HostSyncCounts syncs_before = host_sync_counts();
    const plugin::Platform::LaunchCounts launches_before = r.rt->platform->launch_counts();
    StepOutcome o = train_step(r);
    if (profiled) {
      r.profiler->end_step();
      r.profile_syncs = r.profile_syncs + (host_sync_counts() - syncs_before);
      const plugin::Platform::LaunchCounts now = r.rt->platform->launch_counts();
      r.profile_launches.counted = now.counted;
      r.profile_launches.kernels += now.kernels - launches_before.kernels;
      r.profile_launches.library_calls += now.library_calls - launches_before.library_calls;
    }
    ++r.iteration;
    if (profiled && r.iteration == lg.profile_step_end) finish_profile(r);
    r.consumed_train += tr.global_batch_size;
    r.flops_so_far += r.flops_per_iter;
    r.result.train_losses.push_back(o.lm_loss);
    r.result.grad_norms.push_back(o.skipped ? 0.0 : o.grad_norm);
    ++interval_iters;
    last_lr = o.lr;
    if (o.skipped) ++interval_skipped, ++r.result.skipped_iters;
    // fp16: skipped iterations at the minimum loss scale, which the scaler cannot cure.
    if (a.optimizer.fp16 && tr.check_for_nan_in_loss_and_grad) {
      fp16_skips_at_min =
          o.skipped && r.opt->grad_scaler() && r.opt->loss_scale() <= a.optimizer.min_loss_scale
              ? fp16_skips_at_min + 1
              : 0;
      MG_CHECK(fp16_skips_at_min < kMaxFp16SkipsAtMinLossScale,
               "iteration " << r.iteration << ": " << fp16_skips_at_min
                            << " consecutive iterations skipped (inf/nan loss or gradients) at the "
                               "minimum loss scale "
                            << a.optimizer.min_loss_scale << " (lm loss " << o.lm_loss
                            << "); the fp16 run diverged and the scaler cannot back off further; "
                               "stopping (Megatron's --check-for-nan-in-loss-and-grad). Lower "
                               "--lr, or use --bf16");
    }
    if (o.nan) ++interval_nan, ++r.result.nan_iters;
    if (!o.skipped && !o.nan) {
      interval_loss += o.lm_loss;
      ++interval_count;
      last_grad_norm = o.grad_norm;
      last_num_zeros = o.num_zeros_in_grad;
    }
    r.monitor->after_iteration(
        {.iteration = r.iteration,
         .consumed_samples = r.consumed_train,
         .learning_rate = o.lr,
         .batch_size = tr.global_batch_size,
         .lm_loss = o.lm_loss,
         .loss_scale = r.opt->loss_scale(),
         .grad_norm = o.skipped ? std::nullopt : std::optional<double>(o.grad_norm),
         .num_zeros = o.skipped ? std::nullopt : o.num_zeros_in_grad},
        interval_iters);

    if (r.iteration % a.logging.log_interval == 0) {
      count_host_sync(HostSync::log_interval);
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
      // Megatron's calc_params_l2_norm after this iteration's step (a collective).
      if (a.logging.log_params_norm) s.params_norm = r.opt->params_norm();
      s.skipped_iters = interval_skipped;
      s.nan_iters = interval_nan;
      s.mem_allocated_mb = mem_mb(r, false);
      s.mem_max_allocated_mb = mem_mb(r, true);
      // MoE: load-balancing / z losses and tokens per expert (a collective over the world).
      const auto moe = transformer::moe::moe_metrics_log(
          r.model->moe_state().metrics_tracker, r.ps.world.get(), r.model->config(),
          (a.parallel.sequence_parallel ? a.parallel.tensor_model_parallel_size : 1) *
              a.parallel.context_parallel_size,
          interval_iters, a.logging.moe_per_layer_logging);
      r.monitor->moe_scalars(r.iteration, moe.scalars);
      r.log_last << format_training_log(s) << moe.inline_part << "\n"
                 << moe.layer_lines << std::flush;
      r.monitor->at_log_interval(r.iteration, interval_iters, secs / interval_iters,
                                 r.flops_per_iter, r.log_last, r.log);
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
        r.monitor->evaluation("validation", r.iteration, r.consumed_train, *v);
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
    // --exit-signal-handler: Megatron checks the signal first (an all-reduce over the world).
    if (const int sig = r.monitor->signal_received()) {
      exit_reason = "signal";
      r.log << " received " << signal_name(sig) << " (--exit-signal-handler)" << std::endl;
    }
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count() / 60.0;
    // Megatron all-reduces the decision (max): ranks read their clocks at different moments.
    if (exit_reason.empty() && tr.exit_duration_in_mins &&
        any_rank(r.ps.world.get(), minutes > *tr.exit_duration_in_mins))
      exit_reason = "exit-duration";
    if (exit_reason.empty() && tr.exit_interval && r.iteration % *tr.exit_interval == 0)
      exit_reason = "exit-interval";
    if (!exit_reason.empty()) {
      if (c.save && !saved) save(r);
      r.log << " exiting program at iteration " << r.iteration << " (" << exit_reason << ")"
            << std::endl;
      r.result.exit_reason = exit_reason;
      break;
    }
  }
  if (r.profiler && r.profiler->started()) finish_profile(r);  // training ended inside the window
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
  for (const auto& n : args.notices) log << "NOTE: " << n << std::endl;
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
  if (args.model.fp8.dot_product_attention) {  // docs/fp8.md "FP8 attention"
    for (const auto& [id, name] : {std::pair{ops::OpId::fp8_attention_fwd, "fp8_attention_fwd"},
                                   std::pair{ops::OpId::fp8_attention_bwd, "fp8_attention_bwd"}})
      MG_CHECK((id == ops::OpId::fp8_attention_bwd &&
                !args.model.fp8.dot_product_attention_fp8_backward) ||
                   !r.rt->resolutions()[static_cast<std::size_t>(id)].provider.empty(),
               "--fp8-dot-product-attention: the "
                   << r.rt->platform->name() << " platform has no provider of " << name
                   << (args.deterministic_mode
                           ? " in --deterministic-mode (cuDNN's FP8 backward is not deterministic; "
                             "NVTE_FP8_DPA_BWD=0 runs the backward in the model dtype)"
                           : "")
                   << " (on CUDA it is cuDNN's FP8 SDPA: a build with the cuDNN frontend and "
                      "libcudnn, scripts/install_deps.sh; `build/bin/megatron_info` lists the "
                      "providers)");
  }
  if (args.deterministic_mode)
    check_deterministic_mode(r.ps.world->backend(), r.ps.world->size(), std::getenv("NCCL_ALGO"));
  setup_profiler(r, out_log);
  r.rng_seed = args.training.seed;
  r.train_iters = args.training.total_iters();
  r.monitor = std::make_unique<Monitoring>(args, r.ps.world, *r.rt, log);
  // Progress lines of long start-up work (index building, checkpoint loads): rank 0's log.
  struct ProgressSinkScope {
    std::ostream* previous;
    ~ProgressSinkScope() { set_progress_sink(previous); }
  } progress_scope{set_progress_sink(first ? &out_log : nullptr)};

  // A missing or malformed --load is an error before any work (with --exit-on-missing-checkpoint).
  if (args.checkpoint.load && args.checkpoint.exit_on_missing_checkpoint)
    MG_CHECK(read_latest_iteration(*args.checkpoint.load).has_value(),
             "--load " << *args.checkpoint.load << " has no checkpoint (" << kTrackerFile
                       << " missing) and --exit-on-missing-checkpoint is set");

  // Training data must be asked for: no data path and no --mock-data is an error (not mock data).
  MG_CHECK(args.data.mock || !args.data.data_path.empty() || !args.data.train_data_path.empty() ||
               !args.data.valid_data_path.empty() || !args.data.test_data_path.empty(),
           "no data: pass --data-path (or --train-data-path / --valid-data-path / "
           "--test-data-path) with a Megatron indexed dataset, or --mock-data for synthetic data");
  // Tokenizer, then the data config it completes (validated before any heavy work).
  auto tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  datasets::DataConfig data = args.data;
  data.eod_id = tokenizer->eod();
  data.vocab_size = tokenizer->vocab_size();
  // The identity Megatron-LM records for these tokenizer flags, so --data-cache-path folders are
  // shared with it both ways.
  data.tokenizer_identifiers = datasets::megatron_tokenizer_identifiers(args.tokenizer);
  data.validate();

  // Up front, before allocating: this rank's memory estimate against what it may use.
  MemoryLayout mem_layout = memory_layout(args, r.ps.world->size());
  mem_layout.optimizer_offload = args.optimizer.optimizer_cpu_offload &&
                                 args.optimizer.optimizer_offload_fraction > 0.0 &&
                                 !r.rt->device.is_host();
  const MemoryEstimate estimate =
      estimate_memory(args, tokenizer->vocab_size(), mem_layout, r.ps.pp ? r.ps.pp->rank() : 0);
  const AvailableMemory available = available_memory(*r.rt->platform, r.rt->device.index);
  check_memory_fits(estimate, available, args);

  // 2. The model: this rank's share of it, initialised from --seed.
  naming_allocation("the model's parameters (model_provider)", [&] {
    r.model = model_provider(args.model, tokenizer->vocab_size(), r.ops(), r.rt->device,
                             model_parallel_options(args, r.ps));
    r.model->init_weights(args.training.seed);
  });
  // 3. The data-parallel wrapping: DDP over the gradient buffer (and the distributed optimizer's
  //    shard).
  naming_allocation("the gradient buffers (distributed::parallelize)", [&] {
    r.dp_model = distributed::parallelize(*r.model, args.ddp, r.ps.dp, r.ps.expert_dp);
  });
  // 4. The optimizer and the LR scheduler.
  if (r.model->fp8_state() && r.model->fp8_state()->param_gather()) {
    MG_CHECK(r.dp_model.optimizer_shard, "--fp8-param-gather needs --use-distributed-optimizer");
    r.dp_model.optimizer_shard->quantize_params = [&r] { quantize_fp8_params(r); };
  }
  naming_allocation("the optimizer state (MegatronOptimizer)", [&] {
    r.opt = std::make_unique<optimizer::MegatronOptimizer>(
        args.optimizer, r.model->parameters(), r.model->buffer(), r.ops(),
        optimizer::ParamGroupOptions{}, std::move(r.dp_model.optimizer_shard),
        optimizer::GradStatsGroups{.tp = r.ps.tp, .pp = r.ps.pp, .expert = r.ps.expert_mp});
  });
  r.opt->set_timers(&r.monitor->timers());
  r.scheduler = std::make_unique<optimizer::OptimizerParamScheduler>(
      optimizer::scheduler_config_from_args(args.scheduler));
  r.flops_per_iter = models::num_floating_point_operations(
      r.model->config(), r.model->padded_vocab_size(), args.training.global_batch_size);
  print_summary(r, *tokenizer);
  log << "memory estimate (pipeline rank " << estimate.pipeline_rank << "): " << estimate.str()
      << "; available: " << available.what << std::endl;
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
        << ", expert tensor parallel " << (r.ps.expert_tp ? r.ps.expert_tp->size() : 1)
        << (m.moe_expert_capacity_factor
                ? ", capacity factor " + std::to_string(*m.moe_expert_capacity_factor) + " (" +
                      transformer::to_string(m.moe_token_drop_policy) + ")"
                : std::string(", dropless"))
        << std::endl;
    // DeepSeek-style routing, when asked for (moe_utils.h topk_routing).
    if (m.moe_router_group_topk > 0 || m.moe_router_topk_scaling_factor ||
        m.moe_router_enable_expert_bias) {
      log << "moe router:";
      if (m.moe_router_group_topk > 0)
        log << " group-limited, " << m.moe_router_num_groups << " groups ("
            << m.moe_router_group_topk << " chosen per token);";
      if (m.moe_router_topk_scaling_factor)
        log << " probabilities x " << *m.moe_router_topk_scaling_factor << ";";
      if (m.moe_router_enable_expert_bias)
        log << " expert bias (aux-loss-free), update rate " << m.moe_router_bias_update_rate
            << ", tokens summed over " << (r.ps.expert_bias ? r.ps.expert_bias->size() : 1)
            << " ranks (tp-dp-cp);";
      log << std::endl;
    }
  }
  // 5. The checkpoint (model; optimizer, scheduler, RNG and data position unless told not to).
  load(r);
  init_fp8_params(r);

  // Data: Megatron's split sizes, iterators from the checkpoint's position.
  log << "> building train, validation, and test datasets ..." << std::endl;
  const auto sizes = datasets::megatron_split_sizes(
      args.training.train_iters.value_or(r.train_iters), args.training.global_batch_size,
      args.training.eval_interval, args.training.eval_iters, args.training.train_samples);
  naming_allocation("the datasets' indices (BlendedMegatronDatasetBuilder)", [&] {
    r.splits = datasets::BlendedMegatronDatasetBuilder(data, sizes).build();
  });
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
    naming_allocation("a training step's activations and workspace (train_step, micro batch " +
                          std::to_string(args.training.micro_batch_size) + " x --seq-length " +
                          std::to_string(args.model.seq_length) + ")",
                      [&] { train(r); });
  }
  if (args.ddp.use_megatron_fsdp) {
    const auto& d = *r.dp_model.ddp;
    const auto& buf = r.model->buffer();
    log << "Megatron FSDP " << to_string(args.ddp.sharding_strategy) << ": " << d.param_gathers()
        << " parameter bucket all-gathers in forward and backward; flat "
        << "param+grad buffers resident now " << std::fixed << std::setprecision(3)
        << d.resident_buffer_bytes() / 1048576.0 << " MiB, at most "
        << d.peak_resident_buffer_bytes() / 1048576.0 << " MiB of "
        << static_cast<double>(buf.params.nbytes() + buf.grads.nbytes()) / 1048576.0
        << " MiB on this rank" << std::defaultfloat << std::endl;
    // Prediction vs measurement: parameters + gradients (what the engine held at its peak) and
    // the optimizer state (what the optimizer allocated).
    const double measured =
        static_cast<double>(d.peak_resident_buffer_bytes() + r.opt->state_bytes());
    const double predicted = estimate.parameter_bytes + estimate.gradient_bytes +
                             estimate.optimizer_bytes + estimate.fsdp_parameter_bytes +
                             estimate.fsdp_gradient_bytes;
    log << "memory check: parameters + gradients + optimizer state measured "
        << format_bytes(measured) << ", predicted " << format_bytes(predicted) << " (ratio "
        << std::fixed << std::setprecision(3) << measured / std::max(predicted, 1.0)
        << "); whole process: peak resident set " << format_bytes(peak_rss_bytes())
        << ", predicted total " << format_bytes(estimate.total_bytes()) << std::defaultfloat
        << std::endl;
  }
  r.dp_model.ddp->finish_param_sync();  // --overlap-param-gather: the last step's gather
  r.train_iter.reset();

  // After training: validation and test (Megatron's evaluate_and_print_results), final save.
  // Megatron-LM leaves the process from train() (sys.exit) when --exit-interval,
  // --exit-duration-in-mins or a signal (--exit-signal-handler) stopped the loop, so neither
  // evaluation runs then.
  const bool exited = r.result.exit_reason == "exit-interval" ||
                      r.result.exit_reason == "exit-duration" || r.result.exit_reason == "signal";
  if (exited)
    log << " skipping the final validation and test: training stopped on " << r.result.exit_reason
        << " (as Megatron-LM does)" << std::endl;
  if (!exited && r.valid_iter && r.iteration % args.training.eval_interval != 0) {
    if (auto v = evaluate(r, r.valid_iter.get(), &r.consumed_valid)) {
      r.result.valid_loss = v;
      r.log_last << format_evaluation("validation loss at iteration " +
                                          std::to_string(r.iteration) + " on validation set",
                                      *v)
                 << std::endl;
      r.monitor->evaluation("validation", r.iteration, r.consumed_train, *v);
    }
  }
  if (auto test_iter = exited ? nullptr : make_iterator(r, datasets::Split::test, 0, true)) {
    if (auto v = evaluate(r, test_iter.get(), nullptr)) {
      r.result.test_loss = v;
      r.log_last << format_evaluation(
                        "test loss at iteration " + std::to_string(r.iteration) + " on test set",
                        *v)
                 << std::endl;
      r.monitor->evaluation("test", r.iteration, r.consumed_train, *v);
    }
  }
  const auto& c = args.checkpoint;
  if (c.save && r.iteration > start_iteration && r.result.saved_iteration != r.iteration) save(r);
  if (r.checkpoint_saver.finalize())
    r.log << "  finished the background checkpoint save" << std::endl;
  r.monitor->flush();
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
  if (backend == "fused" && platform == "cpu") {
    // Megatron scripts ask for TE's fused attention; the CPU platform has one attention
    // implementation, the same function as cuDNN's up to rounding: a note, not an error (on a CUDA
    // build without cuDNN, fused stays an error: the user expects the fast path there).
    what = "our kernels (no cuDNN on the CPU platform; fused attention computes the same function)";
  } else if (backend == "fused" || (backend == "auto" && cudnn)) {
    MG_CHECK(cudnn, "--attention-backend fused: no cuDNN fused attention on platform '"
                        << platform << "' (providers 'cuda:cudnn' / '" << cudnn_bwd
                        << "'; a CUDA build that found the cuDNN frontend and libcudnn has them: "
                           "scripts/install_deps.sh); its attention_fwd providers: "
                        << join(fwd) << "; use --attention-backend auto or local");
    prefer("cuda:cudnn", cudnn_bwd);
    const auto version =
        reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_version"));
    what =
        "cuDNN fused attention" + (version ? " (" + std::string(version()) + ")" : "") +
        (deterministic ? ", deterministic backward" : "") +
        "; calls it does not serve (doc_ids masks, cu_seqlens with dropout, causal with Sk < Sq, "
        "f32, other head dims) "
        "run our kernels; its attention dropout masks are cuDNN's own (--attention-backend "
        "local: the CPU's)";
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
