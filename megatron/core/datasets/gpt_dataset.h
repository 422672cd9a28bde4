// Megatron's GPT dataset index construction, exact (FORMATS.md §3.1-3.9): split strings to
// bookends and sequence-id ranges, epochs, the separate-final-epoch rule, document_index,
// sample_index (helpers.cpp build_sample_idx) and shuffle_index drawn from one
// numpy.random.RandomState(seed), and fetching sample k over an abstract SequenceSource.
//
// Invariants: one NumpyRandomState per dataset, used for the document-index shuffle(s) and then
// the shuffle-index shuffle(s), in Megatron's order, so every index equals Megatron's bit for bit.
// Sequence ids in document_index are absolute ids into the source. Indices are stored widened
// (int32 document ids, int64 sample/shuffle entries); Megatron's on-disk element types matter only
// for cache files and are not modelled here.
// Not done here: cache files (§3.10, dataset_cache.h), blending (§3.11), mock data (§3.12), the
// dense attention mask (doc_ids carry it) and the cu_seqlens outputs of §3.9 step 5.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/numpy_random.h"

namespace mg::datasets {

// ---- §3.1 splits ---------------------------------------------------------------------------

// One split's fraction bookends [start, end); std::nullopt when the split is absent (end <= start).
using SplitBookends = std::array<std::optional<std::pair<double, double>>, 3>;

// Megatron's parse_and_normalize_split + convert_split_vector_to_split_matrix: every "[.0-9]+"
// match as a float, padded with 0 to 3 values (more than 3 is an error), each >= 0, normalised by
// the float64 sum (which must be > 0), cumulated from 0. "99,1,0" -> (0,0.99), (0.99,1), absent.
SplitBookends parse_split(std::string_view split);

// The [beg, end) sequence-id range of a present split over N sequences:
// beg = round_half_even(start * N), end = round_half_even(end * N).
std::pair<int64_t, int64_t> split_index_range(std::pair<double, double> bookend, int64_t n);

// ---- §3.3-3.8 indices ----------------------------------------------------------------------

struct GPTIndexConfig {
  int32_t sequence_length = 0;              // S, > 0
  int32_t add_extra_token_to_sequence = 1;  // x, 0 or 1
  uint32_t random_seed = 1234;              // --seed
  // True for train/test; for valid, --drop-last-partial-validation-sequence (default true).
  bool drop_last_partial_sequence = true;
  void validate() const;
};

// §3.3: E, the smallest E >= 1 with E*T >= num_samples*S + x; 1 when num_samples is absent.
int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                       const GPTIndexConfig& config);

// §3.6: `documents` tiled num_epochs times and shuffled once, or, with separate_final_epoch, the
// first E-1 epochs shuffled and then one epoch shuffled on its own, concatenated.
std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch);

// §3.7 (helpers.cpp build_sample_idx): rows (position in document_index, token offset), flat,
// 2 * (num_samples + 1) entries. `sizes` are the lengths of all sequences by absolute id.
std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes,
                                        std::span<const int32_t> document_index,
                                        int32_t sequence_length, int32_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        int32_t add_extra_token_to_sequence);

// §3.8: arange(num_samples) shuffled, then (when total_size > num_samples)
// arange(num_samples, total_size) shuffled on its own, concatenated.
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         NumpyRandomState& rng);

struct GPTIndices {
  int64_t tokens_per_epoch = 0;  // T
  int64_t num_epochs = 1;        // E
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // only meaningful when separate_final_epoch
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;  // flat rows (d, offset)
  std::vector<int64_t> shuffle_index;
  // len(GPTDataset): sample_index rows - 1.
  int64_t num_samples() const { return static_cast<int64_t>(sample_index.size() / 2) - 1; }
};

// GPTDataset._build_document_sample_shuffle_indices: everything above for one split.
// `sizes`: lengths of all sequences by id; `indexed_indices`: the split's absolute ids.
GPTIndices build_gpt_indices(std::span<const int32_t> sizes,
                             std::span<const int32_t> indexed_indices,
                             std::optional<int64_t> num_samples, const GPTIndexConfig& config);

// ---- §3.9 samples --------------------------------------------------------------------------

// Where the tokens come from: IndexedDataset, an in-memory corpus, a mock.
class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  virtual std::size_t sequence_count() const = 0;
  virtual int64_t sequence_length(std::size_t i) const = 0;
  // Tokens [offset, offset + length) of sequence i.
  virtual std::vector<int64_t> read(std::size_t i, int64_t offset, int64_t length) const = 0;
};

// Adapter over an IndexedDataset (not owned; must outlive the adapter).
class IndexedDatasetSource final : public SequenceSource {
 public:
  explicit IndexedDatasetSource(const IndexedDataset& dataset) : dataset_(dataset) {}
  std::size_t sequence_count() const override { return dataset_.sequence_count(); }
  int64_t sequence_length(std::size_t i) const override;
  std::vector<int64_t> read(std::size_t i, int64_t offset, int64_t length) const override;

 private:
  const IndexedDataset& dataset_;
};

struct GPTSample {
  std::vector<int64_t> text;          // S + x raw tokens (pad-filled when partial)
  std::vector<int64_t> document_ids;  // the sequence ids the text came from, in order
  std::vector<int64_t> tokens;        // [S]
  std::vector<int64_t> labels;        // [S]
  std::vector<float> loss_mask;       // [S]
  std::vector<int64_t> position_ids;  // [S], 0..S-1, or restarting after each EOD
  // [S] with reset_attention_mask, else empty: the per-document id of each token (0, 1, ...;
  // +1 after every EOD in tokens, the EOD staying in its document), so "i may attend j" is
  // j <= i && doc_ids[i] == doc_ids[j], exactly Megatron's reset attention mask. Feeds
  // AttentionArgs::doc_ids.
  std::vector<int32_t> doc_ids;
};

// §3.9 step 5 (Megatron's _get_ltor_masks_and_position_ids plus the pad handling).
struct GPTSampleConfig {
  int64_t pad_id = -1;                // §3.9 step 6: -1 when the tokenizer has no distinct pad
  std::optional<int64_t> eod_id;      // the tokenizer's EOD; required by the three flags below
  bool eod_mask_loss = false;         // loss_mask = 0 where tokens == eod
  bool reset_position_ids = false;    // position ids restart at 0 after every EOD
  bool reset_attention_mask = false;  // fill GPTSample::doc_ids
  void validate() const;
};

// §3.9 step 5 on raw text of S + x tokens: tokens, labels, loss_mask, position_ids, doc_ids, with
// pads masked and then replaced by 0.
GPTSample make_gpt_sample(std::vector<int64_t> text, int64_t sequence_length,
                          int32_t add_extra_token_to_sequence, const GPTSampleConfig& config);

// A GPT dataset split: the indices built once, samples fetched on demand from `source` (not owned).
class GPTDataset {
 public:
  GPTDataset(const SequenceSource& source, std::vector<int32_t> indexed_indices,
             std::optional<int64_t> num_samples, GPTIndexConfig config,
             GPTSampleConfig sample_config = {});
  // With indices built elsewhere (a cache file): every entry is checked against `source` (ids in
  // range, sample rows inside their sequences and non-decreasing, shuffle entries < num_samples),
  // so a corrupt cache is an error, not an out-of-bounds read.
  GPTDataset(const SequenceSource& source, std::vector<int32_t> indexed_indices, GPTIndices indices,
             GPTIndexConfig config, GPTSampleConfig sample_config = {});

  int64_t size() const { return indices_.num_samples(); }
  const GPTIndices& indices() const { return indices_; }
  // §3.9 steps 1-4: the S + x raw tokens of sample k and the sequence ids they came from.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> raw_sample(int64_t k) const;
  // §3.9 steps 1-5 (make_gpt_sample).
  GPTSample get(int64_t k) const;
  const GPTSampleConfig& sample_config() const { return sample_config_; }
  const GPTIndexConfig& config() const { return config_; }
  const SequenceSource& source() const { return source_; }
  const std::vector<int32_t>& indexed_indices() const { return indexed_indices_; }

 private:
  const SequenceSource& source_;
  std::vector<int32_t> indexed_indices_;
  GPTIndexConfig config_;
  GPTSampleConfig sample_config_;
  GPTIndices indices_;
};

}  // namespace mg::datasets
