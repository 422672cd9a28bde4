// The model-parallel RNG tracker: Megatron's seeding rules (tensor_parallel/random.py,
// model_parallel_cuda_manual_seed) mapped onto Megatron-CPP's counter-based Philox dropout.
//
// Megatron keeps stateful CUDA generators: the default one seeded with the data-parallel seed
// (`seed`, the same on every TP rank, so dropout on TP-replicated activations stays identical
// across TP ranks), and a tracker holding "model-parallel-rng" seeded with seed + 2718 + tp_rank
// (different per TP rank, forked for dropout inside TP regions: attention probabilities, whose
// heads are split across ranks) and "expert-parallel-rng" seeded with
// seed + 1024 + 100 * ep_rank + tp_rank.
//
// Here dropout is stateless: element e of a mask is philox(seed', offset + e) with seed' =
// dropout_seed(region seed, iteration, micro-batch, layer, site) (transformer/module.h). So:
//   - the tracker maps each named region to its seed with Megatron's formulas above;
//   - "forking" a region is choosing its seed for a DropoutCtx (nothing to save or restore;
//     recomputation replays masks by construction, PITFALLS #6);
//   - a sequence-parallel shard of a TP-replicated activation draws with offset = the global
//     element index of its first row (sequence_parallel_offset), so its mask is the slice of the
//     mask the unsharded activation would get: SP on and off give identical dropout.
// Megatron's +100 * pp_rank on the seed is not needed: the layer index in dropout_seed already
// separates pipeline stages. Initialisation does not use these seeds: weights are drawn per
// parameter name from the full tensor's counters (sharding.h), independent of TP, PP and DP.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace mg::tensor_parallel {

inline constexpr const char* kModelParallelRng = "model-parallel-rng";
inline constexpr const char* kExpertParallelRng = "expert-parallel-rng";
inline constexpr const char* kDataParallelRng =
    "data-parallel-rng";  // Megatron's default generator

// Megatron's offsets.
inline constexpr uint64_t kModelParallelSeedOffset = 2718;
inline constexpr uint64_t kExpertParallelSeedOffset = 1024;

class RngTracker {
 public:
  // Megatron's CudaRNGStatesTracker.add: a name or seed used twice is an error naming both.
  void add(const std::string& name, uint64_t seed);
  bool has(const std::string& name) const { return seeds_.count(name) != 0; }
  // The seed of a region; an unknown name is an error listing the known ones.
  uint64_t seed(const std::string& name) const;
  void reset() { seeds_.clear(); }
  const std::map<std::string, uint64_t>& seeds() const { return seeds_; }

 private:
  std::map<std::string, uint64_t> seeds_;
};

// Megatron's model_parallel_cuda_manual_seed(seed): the data-parallel (default), model-parallel
// and expert-parallel regions.
RngTracker model_parallel_manual_seed(uint64_t seed, int64_t tp_rank, int64_t ep_rank = 0);

// Philox offset of a sequence-parallel shard: the global element index of its first row when the
// full activation [S, B, H] is split along S into `tp_size` shards.
inline uint64_t sequence_parallel_offset(int64_t s_local, int64_t b, int64_t h, int64_t tp_rank) {
  return static_cast<uint64_t>(tp_rank * s_local * b * h);
}

}  // namespace mg::tensor_parallel
