// What every transformer module shares: the build context (op table, device, dtypes, config,
// parallel groups), the parameter declarations that become views into the flat buffers, plain
// (single-rank) linear helpers over the gemm op, and the per-site dropout seeds. The
// tensor-parallel linear layers and embedding are tensor_parallel/layers.h.
//
// Modules are built in two phases: each declares its parameters (name, shape, init rule) into a
// ParamBuilder, which then allocates the flat buffers (reverse order of declaration, parameter.h)
// and points every declared Weight at its views. Modules never move after declaration (the model
// holds them by unique_ptr), so the builder may keep pointers to their Weights.
//
// Gradient rule (all modules): parameter gradients accumulate (+=), activation gradients are
// written (=). Mixed precision: activations and weights in the params dtype P, weight gradients in
// the grad dtype G (f32 under bf16/f16): the wgrad gemms write G directly (gemm allows C f32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tensor_parallel/sharding.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace mg::transformer {

namespace moe {
struct MoEState;  // moe/moe_utils.h
}

struct ModuleContext {
  const ops::OpTable* ops = nullptr;
  Device device;
  const TransformerConfig* config = nullptr;
  DType dtype = DType::f32;       // P: params and activations
  DType grad_dtype = DType::f32;  // G: main_grad
  // Tensor parallelism (tensor_parallel/): the TP group (null: one rank, no communication) and
  // whether activations outside the TP regions are sequence shards [S/TP, B, H].
  comm::ProcessGroup* tp_group = nullptr;
  bool sequence_parallel = false;
  // Context parallelism (context_parallel.h): this rank holds sequence chunks r and 2 CP - 1 - r;
  // core attention runs across the CP group. Inactive by default.
  ContextParallel cp;
  // TP x CP (the tp-cp group): the MoE aux losses' sequence partition under sequence parallelism
  // with CP (moe/moe_layer.h); null otherwise.
  comm::ProcessGroup* tp_cp_group = nullptr;
  // Expert parallelism (moe/): the expert-model-parallel group the routed experts are spread
  // over (null: one rank holds every expert).
  comm::ProcessGroup* ep_group = nullptr;
  // Expert tensor parallelism (--expert-tensor-parallel-size): the group over which each routed
  // expert's linear_fc1 is column- and linear_fc2 row-parallel (null: experts whole).
  comm::ProcessGroup* expert_tp_group = nullptr;
  bool inference_only = false;  // forward only (GPTModelParallel::inference_only)
  // The flat parameter and gradient buffers come from the platform's sparse allocator (FSDP
  // optim_grads / optim_grads_params on a device: GPTModelParallel::sparse_buffers).
  bool sparse_buffers = false;
  // The model's MoE state (aux-loss scale, metrics tracker; moe/moe_utils.h) its MoE layers use;
  // null: the model has no MoE layers.
  moe::MoEState* moe = nullptr;
  // The model's FP8 scaling state (fp8/fp8_state.h) its FP8 linears register with; null: no FP8.
  // fp8_training: the running pass trains (delayed casts record amaxes), set by the model.
  fp8::Fp8State* fp8 = nullptr;
  bool fp8_training = false;
  // Whether FP8 covers the decoder-layer module `prefix` ("decoder.layers.<l>...", l global):
  // FP8 on and the layer not kept out by --first-last-layers-bf16.
  bool fp8_covers(const std::string& prefix) const;
  const ops::OpTable& op() const { return *ops; }
  int64_t tp_rank() const { return tp_group ? tp_group->rank() : 0; }
  int64_t tp_size() const { return tp_group ? tp_group->size() : 1; }
  int64_t etp_rank() const { return expert_tp_group ? expert_tp_group->rank() : 0; }
  int64_t etp_size() const { return expert_tp_group ? expert_tp_group->size() : 1; }
  tensor_parallel::Partition tp_partition(int dim, int stride = 1) const {
    return tensor_parallel::Partition{dim, stride, tp_rank(), tp_size()};
  }
  Tensor empty(const Shape& s) const { return Tensor::empty(s, dtype, device); }
  Tensor zeros(const Shape& s) const { return Tensor::zeros(s, dtype, device); }
  // Per-row statistics (norm mean/rstd, attention lse, loss): f64 for f64, else f32.
  DType stat_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
};

enum class InitRule : uint8_t {
  normal,         // normal(0, init_method_std)
  scaled_normal,  // normal(0, init_method_std / sqrt(2 L)): linear_proj, linear_fc2
  zeros,          // biases; norm weights under apply_layernorm_1p
  ones,           // norm weights
};

// A module's handle on one parameter: its index in the model's list and, once bound, the views.
struct Weight {
  int index = -1;
  Tensor value;  // view into ParamAndGradBuffer::params
  Tensor grad;   // view into ParamAndGradBuffer::grads
  bool defined() const { return index >= 0; }
};

struct ParamDecl {
  InitRule init = InitRule::normal;
  tensor_parallel::Partition partition;  // this rank's shard of the full tensor (sharding.h)
};

class ParamBuilder {
 public:
  explicit ParamBuilder(const ModuleContext& ctx) : ctx_(ctx) {}
  // Declares a parameter in order of first use in forward; `w` is bound at finish().
  // tp_dim: the dim a tensor-parallel layout splits (-1: replicated).
  void add(Weight& w, const std::string& name, const Shape& shape, InitRule init, int tp_dim = -1);
  // A tensor-parallel shard: the parameter is local_shape(global_shape, part); its Parameter
  // records global_shape, part.dim and part.stride, and sequence_parallel (grad summed over TP).
  void add(Weight& w, const std::string& name, const Shape& global_shape, InitRule init,
           const tensor_parallel::Partition& part, bool sequence_parallel = false);
  // Marks the declared parameter `w` as an expert parameter (Parameter::is_expert).
  void set_expert(const Weight& w);
  // Allocates the buffers and binds every declared Weight.
  void finish(std::vector<Parameter>& params, ParamAndGradBuffer& buffer,
              std::vector<ParamDecl>& decls);

 private:
  const ModuleContext& ctx_;
  std::vector<Parameter> params_;
  std::vector<ParamDecl> decls_;
  std::vector<Shape> shapes_;  // local (shard) shapes
  std::vector<Weight*> weights_;
};

// y [N, out] = x [N, in] @ w [out, in]^T (the bias, if any, is the caller's: bias_add or bda).
Tensor linear_fwd(const ModuleContext& ctx, const Tensor& x, const Tensor& w);
// dx [N, in] = dy @ w (beta 0, or beta 1 accumulating into dx when `accumulate`); dw += dy^T @ x.
void linear_bwd(const ModuleContext& ctx, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x,
                const Tensor& w, bool accumulate = false);

// Dropout sites of one layer; the seed of (rng, layer, site) is a splitmix64 chain of all four.
enum class DropoutSite : uint64_t {
  embedding = 1,
  attention_probs = 2,
  attention_bda = 3,
  mlp_bda = 4
};
uint64_t dropout_seed(uint64_t seed, int64_t iteration, int64_t microbatch, int64_t layer,
                      DropoutSite site);
// Seed of a parameter's init draw: splitmix64(seed ^ fnv1a(name)).
uint64_t init_seed(uint64_t seed, const std::string& name);

// The dropout of one micro-batch at one site: p = 0 when not training.
struct DropoutCtx {
  uint64_t seed = 1234;
  int64_t iteration = 0;
  int64_t microbatch = 0;
  bool training = false;
  ops::DropoutArgs args(double p, int64_t layer, DropoutSite site) const;
};

}  // namespace mg::transformer
