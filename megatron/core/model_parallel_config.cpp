// ModelParallelConfig::validate (model_parallel_config.h).
#include "megatron/core/model_parallel_config.h"

#include "megatron/core/common/error.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"

namespace mg {

void ModelParallelConfig::validate(const transformer::TransformerConfig& model,
                                   int virtual_pipeline_size) {
  {
    // Mixture of Experts / expert parallelism: what this build supports, before any work.
    const auto& m = model;
    const int32_t ep = expert_model_parallel_size;
    MG_CHECK(ep >= 1, "--expert-model-parallel-size must be >= 1, got " << ep);
    MG_CHECK(ep == 1 || m.num_moe_experts > 0,
             "--expert-model-parallel-size " << ep << " needs --num-experts");
    if (m.num_moe_experts > 0) {
      MG_CHECK(m.num_moe_experts % ep == 0, "--num-experts " << m.num_moe_experts
                                                             << " must be divisible by "
                                                                "--expert-model-parallel-size "
                                                             << ep);
      const int64_t etp = expert_tensor_parallel_size.value_or(tensor_model_parallel_size);
      const char* etp_default = expert_tensor_parallel_size ? "" : " (Megatron's default: TP)";
      MG_CHECK(etp >= 1, "--expert-tensor-parallel-size must be >= 1, got " << etp);
      MG_CHECK(m.expert_ffn_hidden_size() % etp == 0,
               "--expert-tensor-parallel-size "
                   << etp << etp_default << " must divide the experts' hidden size "
                   << m.expert_ffn_hidden_size()
                   << " (--moe-ffn-hidden-size, else --ffn-hidden-size)");
      MG_CHECK(tensor_model_parallel_size == 1 || sequence_parallel,
               "MoE with --tensor-model-parallel-size "
                   << tensor_model_parallel_size
                   << " needs --sequence-parallel (Megatron's rule: each TP rank routes its own "
                      "sequence shard)");
    }
  }
  {
    const int32_t tp = tensor_model_parallel_size;
    MG_CHECK(tp >= 1, "--tensor-model-parallel-size must be >= 1, got " << tp);
    MG_CHECK(model.num_attention_heads % tp == 0,
             "--num-attention-heads " << model.num_attention_heads
                                      << " must be divisible by --tensor-model-parallel-size "
                                      << tp);
    MG_CHECK(model.num_query_groups % tp == 0, "the number of query groups "
                                                   << model.num_query_groups
                                                   << " (--num-query-groups) must be divisible by "
                                                      "--tensor-model-parallel-size "
                                                   << tp);
    // Megatron's validate_args: "Disabling sequence parallelism because tensor model
    // parallelism is disabled".
    if (tp == 1 && sequence_parallel) {
      sequence_parallel = false;
      sequence_parallel_disabled = true;
    }
  }

  {
    // Context parallelism: sizes and what this build supports, before any work.
    const int32_t cp = context_parallel_size;
    MG_CHECK(cp >= 1, "--context-parallel-size must be >= 1, got " << cp);
    if (cp > 1) {
      MG_CHECK(model.seq_length % (2 * cp) == 0,
               "--seq-length " << model.seq_length << " must be divisible by 2 x "
                               << "--context-parallel-size = " << 2 * cp
                               << " (each CP rank keeps two chunks of S / (2 CP) tokens)");
      MG_CHECK(!sequence_parallel || model.seq_length / cp % tensor_model_parallel_size == 0,
               "--sequence-parallel with --context-parallel-size "
                   << cp << ": the CP rank's " << model.seq_length / cp
                   << " tokens must be divisible by --tensor-model-parallel-size "
                   << tensor_model_parallel_size);
      if (cp_comm_type == "a2a") {
        const int64_t tp = tensor_model_parallel_size;
        MG_CHECK(
            model.num_attention_heads / tp % cp == 0 && model.num_query_groups / tp % cp == 0,
            "--cp-comm-type a2a splits each TP rank's heads across CP: "
                << model.num_attention_heads / tp << " heads and " << model.num_query_groups / tp
                << " query groups per TP rank must be divisible by --context-parallel-size " << cp);
      }
    }
  }
  {
    // Pipeline layout checked before any work (the loop builds it again per rank).
    const auto layout = pipeline_parallel::make_pipeline_layout(
        model.num_layers, pipeline_model_parallel_size, virtual_pipeline_size,
        num_layers_per_virtual_pipeline_stage, decoder_first_pipeline_num_layers,
        decoder_last_pipeline_num_layers);
    virtual_pipeline_model_parallel_size = layout.vp;
  }
}

}  // namespace mg
