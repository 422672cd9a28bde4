// Megatron's BlendedDataset (FORMATS.md §3.11): --data-path blend parsing, weight normalisation,
// per-dataset sample counts with the mid-level surplus, the greedy (helpers.cpp
// build_blending_indices) and exhaustive (build_exhaustive_blending_indices) blending indices, the
// over-request check, and sample k -> (dataset, sample).
//
// Invariants: indices equal Megatron's bit for bit (same float64 error rule, t = max(s, 1),
// strictly-greater argmax so the lowest index wins ties); dataset_index is int16 as in Megatron,
// so at most 32767 datasets. Weights are normalised as w / numpy.sum(w) (pairwise summation).
// Cache files, descriptions and building the children from prefixes are the builder's
// (blended_megatron_dataset_builder.h, dataset_cache.h), which uses the index functions here.
// Deviation: the exhaustive build never picks a dataset of size 0 (Megatron would overrun it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/datasets/gpt_dataset.h"

namespace mg::datasets {

inline constexpr double kDefaultMidLevelDatasetSurplus = 0.005;  // --mid-level-dataset-surplus

// A parsed --data-path list: prefixes, and weights when the list is "w1 p1 w2 p2 ..." pairs.
struct BlendSpec {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as written, not normalised
};

// Even length with every even-position entry a number: pairs. Odd length, or any weight that does
// not parse as a float: all entries are prefixes, no weights. An empty list is an error.
BlendSpec parse_blend(std::span<const std::string> data_path);

// w / sum(w) in float64, sum as numpy.sum. Weights must be finite, >= 0, and sum to > 0.
std::vector<double> normalize_weights(std::span<const double> weights);

// Per dataset: ceil(ceil(n * w_i) * (1 + surplus)), the num_samples each child is built with.
std::vector<int64_t> blend_num_samples(std::span<const double> normalized_weights, int64_t n,
                                       double surplus = kDefaultMidLevelDatasetSurplus);

// The blended size with weights: sum_i ceil(n * w_i) (may exceed n).
int64_t blended_size(std::span<const double> normalized_weights, int64_t n);

struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // [size] which dataset sample k comes from
  std::vector<int64_t> dataset_sample_index;  // [size] the sample within that dataset
};

// Greedy: for s in [0, size), t = max(s, 1), pick argmax_i (w_i * t - count_i), emit (i, count_i).
BlendingIndices build_blending_indices(std::span<const double> normalized_weights, int64_t size);

// Exhaustive: the same rule with w = sizes / sum(sizes), over datasets with unspent samples, until
// every dataset has emitted sizes[i] samples (total sum(sizes)).
BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes);

// Throws if any dataset is asked for more samples than it has, naming it (names[i] when given,
// else "dataset i").
void check_blend_bounds(const BlendingIndices& indices, std::span<const int64_t> dataset_lengths,
                        std::span<const std::string> names = {});

struct BlendedSample {
  GPTSample sample;
  int64_t dataset_id = 0;
};

// A blend of GPTDatasets (not owned; must outlive it). With weights, size must be given (greedy
// build); without weights, the weights are the dataset lengths and size is min(size, total) with
// the greedy build, or, when size is absent, the exhaustive build over every sample.
class BlendedDataset {
 public:
  BlendedDataset(std::vector<const GPTDataset*> datasets,
                 std::optional<std::vector<double>> weights, std::optional<int64_t> size,
                 std::vector<std::string> names = {});

  int64_t size() const { return static_cast<int64_t>(indices_.dataset_index.size()); }
  const BlendingIndices& indices() const { return indices_; }
  const std::vector<double>& weights() const { return weights_; }  // normalised
  // Sample k -> (dataset, sample within it).
  std::pair<int64_t, int64_t> locate(int64_t k) const;
  BlendedSample get(int64_t k) const;

 private:
  std::vector<const GPTDataset*> datasets_;
  std::vector<double> weights_;
  BlendingIndices indices_;
};

}  // namespace mg::datasets
