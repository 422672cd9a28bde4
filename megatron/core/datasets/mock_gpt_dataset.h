// Megatron's MockGPTLowLevelDataset (--mock-data, FORMATS.md §3.12) as a SequenceSource, so the
// ordinary GPTDataset index construction (§3.3-3.8) samples it exactly as Megatron does.
//
// Invariants: 100,000 documents whose lengths are numpy.random.default_rng(0).integers(1, 4096,
// 100000, dtype=int32) bit for bit (numpy_pcg64.h); document i of length L is
// [1 % V, 2 % V, ..., (L-1) % V, eod] as int64; the split is always "1,1,1", i.e. id ranges
// [0,33333), [33333,66667), [66667,100000). Tokens are computed on read, never stored.
// The choice of mock vs real data and the cache files are the builder's
// (blended_megatron_dataset_builder.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "megatron/core/datasets/gpt_dataset.h"

namespace mg::datasets {

inline constexpr int64_t kMockGPTDocumentCount = 100000;
inline constexpr int32_t kMockGPTMaxSequenceLength = 4096;  // exclusive bound on lengths
inline constexpr const char* kMockGPTSplit = "1,1,1";

// default_rng(0).integers(low=1, high=4096, size=100000, dtype=int32).
std::vector<int32_t> mock_gpt_document_lengths();

class MockGPTSource final : public SequenceSource {
 public:
  // vocab_size V > 0; eod_id is the tokenizer's EOD token (any value, it is not reduced mod V).
  MockGPTSource(int64_t vocab_size, int64_t eod_id);

  std::size_t sequence_count() const override { return lengths_.size(); }
  int64_t sequence_length(std::size_t i) const override;
  // Tokens [offset, offset + length) of document i; the range must lie inside the document.
  std::vector<int64_t> read(std::size_t i, int64_t offset, int64_t length) const override;

  const std::vector<int32_t>& lengths() const { return lengths_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t eod_id() const { return eod_id_; }

 private:
  std::vector<int32_t> lengths_;
  int64_t vocab_size_;
  int64_t eod_id_;
};

// The [beg, end) document-id ranges of train/valid/test under the mock's "1,1,1" split.
std::array<std::pair<int64_t, int64_t>, 3> mock_gpt_split_ranges();

// The absolute document ids of split `split_index` (0 train, 1 valid, 2 test).
std::vector<int32_t> mock_gpt_split_indices(int split_index);

// MockGPTDataset: a GPTDataset over `source` (not owned; must outlive the dataset) for one split.
GPTDataset make_mock_gpt_dataset(const MockGPTSource& source, int split_index,
                                 std::optional<int64_t> num_samples, const GPTIndexConfig& config,
                                 GPTSampleConfig sample_config = {});

}  // namespace mg::datasets
