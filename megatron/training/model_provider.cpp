// model_provider and model_parallel_options (model_provider.h).
#include "megatron/training/model_provider.h"

#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/transformer/context_parallel.h"

namespace mg::training {

models::GPTModelParallel model_parallel_options(const Arguments& args, const ParallelState& ps) {
  models::GPTModelParallel par;
  par.tp_group = ps.tp.get();
  par.sequence_parallel = args.parallel.sequence_parallel;
  if (ps.ep && ps.ep->size() > 1) par.ep_group = ps.ep.get();
  if (ps.expert_tp && ps.expert_tp->size() > 1) par.expert_tp_group = ps.expert_tp.get();
  if (ps.cp) par.cp = {ps.cp.get(), transformer::parse_cp_comm_type(args.parallel.cp_comm_type)};
  par.tp_cp_group = ps.tp_cp.get();
  if (ps.pp) par.pipeline_chunks = ps.layout.chunks(ps.pp->rank());
  par.amax_group = ps.amax.get();
  par.sparse_buffers = args.ddp.use_megatron_fsdp && args.ddp.shards_grads();
  return par;
}

std::unique_ptr<models::GPTModel> model_provider(const transformer::TransformerConfig& config,
                                                 int64_t vocab_size, const ops::OpTable& ops,
                                                 Device device,
                                                 const models::GPTModelParallel& parallel) {
  transformer::TransformerConfig finalized = config;  // the spec reads derived fields
  finalized.finalize();
  return std::make_unique<models::GPTModel>(
      config, vocab_size, ops, device, models::get_gpt_decoder_block_spec(finalized), parallel);
}

}  // namespace mg::training
