// What a training loop calls to get its train/valid/test datasets: Megatron's
// BlendedMegatronDatasetBuilder (blended_megatron_dataset_builder.py) over a plain DataConfig, and
// the MegatronDataset interface that GPTDataset, MockGPTDataset and BlendedDataset splits share.
//
// Semantics follow Megatron-Core 0.16: mock data when neither --data-path nor per-split paths are
// given (split "1,1,1"); one unweighted prefix -> plain GPTDatasets; a weighted blend -> children
// built with ceil(ceil(n*w)*(1+surplus)) samples and a BlendedDataset of sum(ceil(n*w)) samples;
// an unweighted multi-prefix blend -> one-epoch children blended by their lengths (greedy when the
// split size is known, exhaustive when it is not); per-split paths use the whole file (0, 1).
// Indices are cached under --data-cache-path (or <prefix>/cache/GPTDataset_indices/ for real data,
// as Megatron does) with Megatron's file names, descriptions and MD5s (dataset_cache.h); several
// ranks may build at once: one builds under a lock, the others load its files.
// Not done: --multiple-validation-sets, --full-validation's padding samples, fast-cache-load,
// defer-npy-index-mmap, S3/MSC paths, the dense [1,S,S] attention mask (doc_ids carry it).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/datasets/dataset_cache.h"
#include "megatron/core/datasets/gpt_dataset.h"

namespace mg::datasets {

// Megatron's Split enum; the value is the index into every per-split array.
enum class Split : int { train = 0, valid = 1, test = 2 };
inline constexpr std::array<Split, 3> kSplits = {Split::train, Split::valid, Split::test};
std::string_view split_name(Split split);  // "train", "valid", "test"

// A dataset split as the training loop sees it. Implementations are immutable after construction
// and get() is safe to call from one thread other than the builder's (the prefetch thread).
class MegatronDataset {
 public:
  virtual ~MegatronDataset() = default;
  virtual int64_t size() const = 0;
  // Sample k in [0, size()): tokens/labels/loss_mask/position_ids [S], doc_ids [S] with
  // reset_attention_mask (see GPTSample).
  virtual GPTSample get(int64_t k) const = 0;
  // "GPTDataset", "MockGPTDataset" or "BlendedDataset".
  virtual std::string_view class_name() const = 0;
  // Megatron's unique_description (json.dumps(indent=4)) and its MD5, the cache key.
  virtual const std::string& unique_description() const = 0;
  virtual const std::string& unique_description_hash() const = 0;
};

// Everything the builder needs, with Megatron's flag names and defaults.
struct DataConfig {
  // --data-path: "p" | "p1 p2 ..." | "w1 p1 w2 p2 ...", one entry per word (split_words()).
  std::vector<std::string> data_path;
  // --train-data-path / --valid-data-path / --test-data-path (each a blend like data_path). Not
  // with data_path. An empty one leaves that split absent.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  // --mock-data. Also implied when no path is given at all, as in Megatron.
  bool mock = false;
  // --split. Unset with data_path: "969, 30, 1" (Megatron's default). Must stay unset with the
  // per-split paths; ignored for mock data ("1,1,1").
  std::optional<std::string> split;
  int32_t seq_length = 0;  // --seq-length, > 0
  uint32_t seed = 1234;    // --seed
  // --data-cache-path. Unset: real data caches in <prefix>/cache/GPTDataset_indices/, mock data
  // is not cached (Megatron's rule).
  std::optional<std::string> data_cache_path;
  bool reset_position_ids = false;     // --reset-position-ids
  bool reset_attention_mask = false;   // --reset-attention-mask: GPTSample::doc_ids
  bool eod_mask_loss = false;          // --eod-mask-loss
  bool create_attention_mask = false;  // accepted for Megatron parity; samples never carry the
                                       // dense mask (the attention kernel takes causal + doc_ids)
  int64_t eod_id = -1;                 // the tokenizer's EOD; required (>= 0) by the three flags
                                       // above and by mock data
  int64_t pad_id = -1;                 // the tokenizer's distinct pad, else -1 (§3.9 step 6)
  int64_t vocab_size = 0;              // the tokenizer's vocab size; required (> 0) by mock data
  bool add_extra_token_to_sequence = true;            // x = 1
  bool drop_last_partial_validation_sequence = true;  // --no-... flips it
  double mid_level_dataset_surplus = 0.005;           // --mid-level-dataset-surplus
  // The tokenizer's unique_identifiers, embedded in every description (and so in the MD5). Only
  // matters for sharing caches with Python; see legacy_tokenizer_identifiers().
  PyJson tokenizer_identifiers = PyJson::object({{"class", PyJson("NullTokenizer")}});

  // Throws naming the offending field and what is valid.
  void validate() const;
};

// Whitespace-separated words of a flag value ("0.3 a 0.7 b" -> {"0.3","a","0.7","b"}).
std::vector<std::string> split_words(std::string_view text);

// Megatron's train_valid_test_num_samples: train = train_samples or train_iters * gbs;
// valid = (train_iters / eval_interval + 1) * eval_iters * gbs; test = eval_iters * gbs.
std::array<std::optional<int64_t>, 3> megatron_split_sizes(
    int64_t train_iters, int64_t global_batch_size, int64_t eval_interval, int64_t eval_iters,
    std::optional<int64_t> train_samples = std::nullopt);

// The train/valid/test datasets; null where a split is absent (e.g. "100,0,0" or no test path).
using DatasetSplits = std::array<std::shared_ptr<const MegatronDataset>, 3>;

class BlendedMegatronDatasetBuilder {
 public:
  // sizes: the minimum number of samples per split (megatron_split_sizes), nullopt = one epoch.
  BlendedMegatronDatasetBuilder(DataConfig config, std::array<std::optional<int64_t>, 3> sizes);
  // Builds (or loads from the cache) every split. Call on every rank; safe concurrently.
  DatasetSplits build() const;

 private:
  DataConfig config_;
  std::array<std::optional<int64_t>, 3> sizes_;
};

}  // namespace mg::datasets
