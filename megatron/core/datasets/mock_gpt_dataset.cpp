// MockGPTLowLevelDataset and its "1,1,1" split (see mock_gpt_dataset.h).
#include "megatron/core/datasets/mock_gpt_dataset.h"

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/numpy_pcg64.h"

namespace mg::datasets {

std::vector<int32_t> mock_gpt_document_lengths() {
  NumpyPCG64 rng(0);
  return rng.integers_int32(1, kMockGPTMaxSequenceLength,
                            static_cast<std::size_t>(kMockGPTDocumentCount));
}

MockGPTSource::MockGPTSource(int64_t vocab_size, int64_t eod_id)
    : lengths_(mock_gpt_document_lengths()), vocab_size_(vocab_size), eod_id_(eod_id) {
  MG_CHECK(vocab_size > 0, "MockGPTSource: vocab_size must be > 0, got " << vocab_size);
}

int64_t MockGPTSource::sequence_length(std::size_t i) const {
  MG_CHECK(i < lengths_.size(),
           "MockGPTSource: document " << i << " out of [0, " << lengths_.size() << ")");
  return lengths_[i];
}

std::vector<int64_t> MockGPTSource::read(std::size_t i, int64_t offset, int64_t length) const {
  const int64_t n = sequence_length(i);
  MG_CHECK(offset >= 0 && length >= 0 && offset + length <= n,
           "MockGPTSource: tokens [" << offset << ", " << offset + length << ") of document " << i
                                     << " outside its length " << n);
  std::vector<int64_t> out(static_cast<std::size_t>(length));
  for (int64_t j = 0; j < length; ++j) {
    const int64_t pos = offset + j;
    out[static_cast<std::size_t>(j)] = pos == n - 1 ? eod_id_ : (pos + 1) % vocab_size_;
  }
  return out;
}

std::array<std::pair<int64_t, int64_t>, 3> mock_gpt_split_ranges() {
  const SplitBookends bookends = parse_split(kMockGPTSplit);
  std::array<std::pair<int64_t, int64_t>, 3> out{};
  for (std::size_t s = 0; s < 3; ++s)
    out[s] = split_index_range(*bookends[s], kMockGPTDocumentCount);
  return out;
}

std::vector<int32_t> mock_gpt_split_indices(int split_index) {
  MG_CHECK(split_index >= 0 && split_index < 3,
           "mock_gpt_split_indices: split_index must be 0, 1 or 2, got " << split_index);
  const auto [beg, end] = mock_gpt_split_ranges()[static_cast<std::size_t>(split_index)];
  std::vector<int32_t> ids;
  ids.reserve(static_cast<std::size_t>(end - beg));
  for (int64_t id = beg; id < end; ++id) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

GPTDataset make_mock_gpt_dataset(const MockGPTSource& source, int split_index,
                                 std::optional<int64_t> num_samples, const GPTIndexConfig& config,
                                 GPTSampleConfig sample_config) {
  return GPTDataset(source, mock_gpt_split_indices(split_index), num_samples, config,
                    sample_config);
}

}  // namespace mg::datasets
