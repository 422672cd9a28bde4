// Sampling the next token from logits (Megatron-Core's text_generation_controller
// sample_from_logits with SamplingParams): greedy, or temperature -> top-k -> top-p -> a draw.
//
//   greedy (or top_k == 1): the argmax (lowest id on ties)
//   otherwise: logits / temperature; keep the top_k largest (0: all); of those, sorted by logit
//   (ties: lower id first), keep the smallest prefix whose probability mass reaches top_p
//   (0: all; a token is dropped iff the mass before it already exceeds top_p, so the first is
//   always kept, as Megatron's and HF's shifted mask); softmax over the kept ones (f64); draw
//   with the Sampler's generator.
// The generator is std::mt19937_64 seeded with `seed`, uniforms (x >> 11) * 2^-53, so a seed gives
// the same tokens on every platform and build. Only the real vocabulary is sampled: the caller
// passes the first V logits (padding rows never win).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace mg::inference {

struct SamplingParams {
  bool greedy = false;       // --greedy: argmax
  double temperature = 1.0;  // --temperature (> 0)
  int64_t top_k = 0;         // --top-k: 0 = no limit; 1 = greedy
  double top_p = 0.0;        // --top-p: 0 = no limit, else in (0, 1]
  uint64_t seed = 1234;      // --seed

  // Throws mg::Error naming a bad value and the valid range.
  void validate() const;
};

// The distribution a draw samples from: probability per id (0 where filtered out), sums to 1.
// Greedy: one-hot at the argmax.
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // The next token id in [0, logits.size()).
  int64_t sample(std::span<const float> logits);
  // The next uniform in [0, 1) of the generator (tests reproduce draws with it).
  double uniform();

 private:
  SamplingParams p_;
  std::mt19937_64 gen_;
};

}  // namespace mg::inference
