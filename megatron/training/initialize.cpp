// initialize_model_parallel and complete_arguments (initialize.h).
#include "megatron/training/initialize.h"

#include <chrono>

#include "megatron/core/common/error.h"
#include "megatron/core/pipeline_parallel/schedules.h"

namespace mg::training {

ParallelState initialize_model_parallel(const Arguments& args) {
  ParallelState ps;
  const int32_t tp = args.parallel.tensor_model_parallel_size,
                pp = args.parallel.pipeline_model_parallel_size,
                cp = args.parallel.context_parallel_size;
  const bool moe = args.model.num_moe_experts > 0;
  ps.layout = pipeline_parallel::make_pipeline_layout(
      args.model.num_layers, pp, args.parallel.virtual_pipeline_model_parallel_size, std::nullopt,
      args.parallel.decoder_first_pipeline_num_layers,
      args.parallel.decoder_last_pipeline_num_layers);
  ps.communicator = comm::init_communicator(args.distributed_backend);
  ps.communicator->set_default_timeout(std::chrono::minutes(args.distributed_timeout_minutes));
  const int world = ps.communicator->world_size();
  MG_CHECK(world % (tp * pp * cp) == 0, "world size " << world << " must be divisible by "
                                                      << "--tensor-model-parallel-size " << tp
                                                      << " x --pipeline-model-parallel-size " << pp
                                                      << " x --context-parallel-size " << cp);
  parallel_state::ParallelDims dims;
  dims.tp = tp;
  dims.pp = pp;
  dims.cp = cp;
  if (moe) {
    dims.ep = args.parallel.expert_model_parallel_size;
    dims.etp = static_cast<int>(args.parallel.expert_tensor_parallel_size.value_or(tp));
    MG_CHECK(world % (dims.etp * dims.ep * pp) == 0,
             "world size " << world << " must be divisible by --expert-tensor-parallel-size "
                           << dims.etp << " x --expert-model-parallel-size " << dims.ep
                           << " x --pipeline-model-parallel-size " << pp
                           << " (Megatron's expert grid: ETP x EP x expert-DP x PP)");
  }
  ps.dims = dims.resolved(world);
  auto groups = parallel_state::make_process_groups(*ps.communicator, ps.dims);
  ps.world = groups.world;
  ps.dp = groups.dp_cp;
  if (cp > 1) {
    ps.cp = groups.cp;
    ps.data = groups.dp;
  }
  if (tp > 1) ps.tp = groups.tp;
  if (pp > 1) {
    ps.pp = groups.pp;
    if (!args.model.untie_embeddings_and_output_weights) ps.embedding = groups.embedding;
  }
  // Expert groups where experts are not plain data-parallel parameters (EP > 1, TP > 1 or ETP > 1:
  // the expert grid then differs from the dense one).
  if (moe && (args.parallel.expert_model_parallel_size > 1 || tp > 1 || ps.dims.etp > 1)) {
    ps.ep = groups.ep;
    ps.expert_dp = groups.expert_dp;
    ps.expert_mp = groups.tp_ep_pp;
    if (ps.dims.etp > 1) ps.expert_tp = groups.expert_tp;
  }
  if (moe && tp > 1 && cp > 1) ps.tp_cp = groups.tp_cp;
  if (args.model.fp8.enabled()) {
    const comm::ProcessGroupPtr& g =
        args.model.fp8.tp_only_amax_red ? groups.tp_cp : groups.tp_dp_cp;
    if (g && g->size() > 1) ps.amax = g;
  }
  if (moe && args.model.moe_router_enable_expert_bias && groups.tp_dp_cp &&
      groups.tp_dp_cp->size() > 1)
    ps.expert_bias = groups.tp_dp_cp;
  return ps;
}

Arguments complete_arguments(const Arguments& given, const ParallelState& ps) {
  Arguments args = given;
  auto& tr = args.training;
  tr.data_parallel_size = ps.dp->size() / args.parallel.context_parallel_size;  // dp is dp-cp
  bool gbs_given = false;
  for (const auto& [flag, values] : args.given) gbs_given |= flag == "--global-batch-size";
  if (!gbs_given) tr.global_batch_size = tr.micro_batch_size * tr.data_parallel_size;
  MG_CHECK(tr.global_batch_size % (tr.micro_batch_size * tr.data_parallel_size) == 0,
           "--global-batch-size " << tr.global_batch_size
                                  << " must be a multiple of --micro-batch-size "
                                  << tr.micro_batch_size << " x data-parallel size "
                                  << tr.data_parallel_size);
  args.scheduler.global_batch_size = tr.global_batch_size;
  // The bucket NaN check (before the collective) only where a NaN gradient cannot be a normal
  // event: under fp16 an overflow (inf/nan grads) is the loss scaler's, which skips the step.
  // One rank: the loss check of train_step reports it as before.
  args.ddp.check_for_nan_in_grad =
      tr.check_for_nan_in_loss_and_grad && tr.data_parallel_size > 1 && !args.optimizer.fp16;
  args.ddp.calculate_per_token_loss = args.model.calculate_per_token_loss;
  // Megatron's check: the micro-batches the interleaved schedule needs.
  if (ps.pp && ps.layout.vp > 1)
    pipeline_parallel::check_interleaved_microbatches(ps.layout.pp, tr.num_microbatches());
  return args;
}

}  // namespace mg::training
