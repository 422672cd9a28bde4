// The training loop's guards against bad state (issue 24, README "Reliability"):
//   * finiteness of tensors (one l2_norm_sq pass on their device; the tensor named only on the
//     error path), used before the optimizer applies a step and before a save moves the tracker;
//   * the fp16 bound: consecutive skipped iterations at --min-loss-scale;
//   * the memory a rank may use, for the up-front estimate's refusal (memory_estimate.h), and
//     out-of-memory turned into an error naming what was being allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/optimizer/state_dict.h"
#include "megatron/core/transformer/parameter.h"
#include "megatron/plugin/platform.h"
#include "megatron/training/memory_estimate.h"

namespace mg::training {

// Whether every element of `xs` is finite (one l2_norm_sq over them on their device, in f64).
bool all_finite(const ops::OpTable& ops, std::span<const Tensor> xs);

// The name of the first parameter (in order) whose value (grads = false) or main_grad (grads =
// true) holds a NaN or inf on this rank; nullopt when all are finite. Host copies: error path only.
std::optional<std::string> first_nonfinite_parameter(const std::vector<transformer::Parameter>& ps,
                                                     bool grads);
// The first key of `sd`'s floating tensors holding a NaN or inf.
std::optional<std::string> first_nonfinite_state(const optimizer::StateDict& sd);

// Strict loads: the model-defining settings of the checkpoint's recorded flags (metadata.json
// "args", parsed as the run parsed them) against this run's: layers, hidden, FFN, heads, query
// groups, kv-channels, normalisation (and its 1p form), activation, biases, QK norm, positions,
// RoPE base and percent, tied output, MoE experts / top-k / expert FFN, and the real vocabulary
// (metadata "vocab_size" vs `vocab_size`). One line per difference, "--flag: the checkpoint has
// X, this run Y"; empty when they agree or the checkpoint records no flags.
std::vector<std::string> checkpoint_model_mismatches(const nlohmann::json& metadata,
                                                     const Arguments& current, int64_t vocab_size);

// fp16: a skipped iteration at the minimum loss scale cannot be cured by the scaler any more. The
// run stops after this many consecutive such iterations (with --check-for-nan-in-loss-and-grad).
// Megatron keeps skipping forever, and its NaN-loss check stops an fp16 run at the first NaN loss.
inline constexpr int64_t kMaxFp16SkipsAtMinLossScale = 10;

// The memory one rank may use on `platform`'s device: its total memory; on the host divided by
// the ranks sharing the node (OMPI_COMM_WORLD_LOCAL_SIZE, LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE,
// MPI_LOCALNRANKS; else 1).
AvailableMemory available_memory(const plugin::Platform& platform, int device);
int local_world_size();

// Runs f(); a std::bad_alloc (a host container or allocator out of memory) becomes an mg::Error
// naming `what` was being allocated, and an mg::Error from an allocator gets `what` prepended.
template <class F>
decltype(auto) naming_allocation(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    MG_THROW("out of memory while allocating " << what << " (std::bad_alloc)");
  } catch (const Error& e) {
    const std::string& m = e.message();
    if (m.find("out of memory") == std::string::npos && m.find("allocation") == std::string::npos)
      throw;
    MG_THROW("out of memory while allocating " << what << ": " << m);
  }
}

}  // namespace mg::training
