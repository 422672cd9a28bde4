#include "megatron/core/fp8/fp8_config.h"

#include "megatron/core/common/error.h"

namespace mg::fp8 {

bool Fp8Config::layer_in_fp8(int64_t layer, int64_t num_layers) const {
  if (!enabled()) return false;
  if (!first_last_layers_bf16) return true;
  return layer >= num_layers_at_start_in_bf16 && layer < num_layers - num_layers_at_end_in_bf16;
}

void Fp8Config::validate(int64_t num_layers) const {
  if (!enabled()) return;
  MG_CHECK(amax_history_len >= 1,
           "--fp8-amax-history-len " << amax_history_len << ": must be at least 1");
  MG_CHECK(margin >= 0, "--fp8-margin " << margin << ": must be >= 0");
  if (first_last_layers_bf16) {
    MG_CHECK(num_layers_at_start_in_bf16 >= 0 && num_layers_at_end_in_bf16 >= 0 &&
                 num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 <= num_layers,
             "--num-layers-at-start-in-bf16 "
                 << num_layers_at_start_in_bf16 << " and --num-layers-at-end-in-bf16 "
                 << num_layers_at_end_in_bf16 << ": each >= 0, together at most --num-layers "
                 << num_layers);
  }
}

const char* format_name(Fp8Format f) {
  switch (f) {
    case Fp8Format::none:
      return "none";
    case Fp8Format::e4m3:
      return "e4m3";
    case Fp8Format::hybrid:
      return "hybrid";
  }
  return "?";
}

const char* recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::delayed ? "delayed" : "tensorwise";
}

const char* amax_algo_name(AmaxComputeAlgo a) {
  return a == AmaxComputeAlgo::max ? "max" : "most_recent";
}

float fp8_max(DType t) {
  MG_CHECK(t == DType::fp8_e4m3 || t == DType::fp8_e5m2,
           "fp8_max: " << dtype_name(t) << " is not an FP8 dtype");
  return t == DType::fp8_e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
}

}  // namespace mg::fp8
