// Named dropout regions and Megatron's model-parallel seeding rules (random.h).
#include "megatron/core/tensor_parallel/random.h"

#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::tensor_parallel {

void RngTracker::add(const std::string& name, uint64_t seed) {
  MG_CHECK(!has(name),
           "RNG region '" << name << "' already exists (seed " << seeds_.at(name) << ")");
  for (const auto& [n, s] : seeds_)
    MG_CHECK(s != seed, "seed " << seed << " of RNG region '" << name
                                << "' is already used by region '" << n << "'");
  seeds_.emplace(name, seed);
}

uint64_t RngTracker::seed(const std::string& name) const {
  const auto it = seeds_.find(name);
  if (it != seeds_.end()) return it->second;
  std::ostringstream known;
  for (const auto& [n, s] : seeds_) known << " '" << n << "'";
  MG_THROW("RNG region '" << name << "' is not in the tracker; it has:" << known.str());
}

RngTracker model_parallel_manual_seed(uint64_t seed, int64_t tp_rank, int64_t ep_rank) {
  MG_CHECK(tp_rank >= 0 && ep_rank >= 0,
           "model_parallel_manual_seed: tp_rank " << tp_rank << ", ep_rank " << ep_rank);
  RngTracker t;
  t.add(kDataParallelRng, seed);
  t.add(kModelParallelRng, seed + kModelParallelSeedOffset + static_cast<uint64_t>(tp_rank));
  t.add(kExpertParallelRng, seed + kExpertParallelSeedOffset +
                                100 * static_cast<uint64_t>(ep_rank) +
                                static_cast<uint64_t>(tp_rank));
  return t;
}

}  // namespace mg::tensor_parallel
