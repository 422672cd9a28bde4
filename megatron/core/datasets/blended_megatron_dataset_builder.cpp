// Megatron's BlendedMegatronDatasetBuilder (see blended_megatron_dataset_builder.h): which datasets
// each split gets, their sample counts, their descriptions (the cache keys) and their cached
// indices. The control flow mirrors blended_megatron_dataset_builder.py branch for branch.
#include "megatron/core/datasets/blended_megatron_dataset_builder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/blended_dataset.h"
#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/mock_gpt_dataset.h"

namespace mg::datasets {
namespace {

constexpr const char* kDefaultSplit = "969, 30, 1";  // Megatron's --split default with --data-path

// The tokens of one prefix (or of the mock), shared by the splits built over it.
struct LowLevelDataset {
  std::unique_ptr<IndexedDataset> indexed;  // null for the mock
  std::unique_ptr<SequenceSource> source;
  std::vector<int32_t> sizes;  // every sequence's length
};

std::shared_ptr<const LowLevelDataset> build_low_level(const DataConfig& c,
                                                       const std::optional<std::string>& prefix) {
  auto low = std::make_shared<LowLevelDataset>();
  if (prefix) {
    low->indexed = std::make_unique<IndexedDataset>(*prefix);
    low->source = std::make_unique<IndexedDatasetSource>(*low->indexed);
    low->sizes = low->indexed->sequence_lengths();
  } else {
    auto mock = std::make_unique<MockGPTSource>(c.vocab_size, c.eod_id);
    low->sizes = mock->lengths();
    low->source = std::move(mock);
  }
  return low;
}

// Megatron's split_matrix as json.dumps writes it: tuples as lists, None as null, and the first
// bookend starting at the integer 0 (Python cumulates from the int 0).
PyJson split_matrix_json(const SplitBookends& m) {
  PyJson::Array out;
  for (std::size_t s = 0; s < 3; ++s) {
    if (!m[s]) {
      out.emplace_back();
      continue;
    }
    PyJson start = s == 0 ? PyJson(int64_t{0}) : PyJson(m[s]->first);
    out.push_back(PyJson::array({start, PyJson(m[s]->second)}));
  }
  return PyJson::array(std::move(out));
}

PyJson optional_int(std::optional<int64_t> v) {
  return v ? PyJson(*v) : PyJson();
}

// What every split description shares: config.split / split_matrix (null with per-split paths).
struct SplitInfo {
  PyJson split;         // the raw --split string, or null
  PyJson split_matrix;  // or null
};

// A GPTDataset / MockGPTDataset split.
class GPTSplitDataset final : public MegatronDataset {
 public:
  GPTSplitDataset(const DataConfig& c, std::shared_ptr<const LowLevelDataset> low,
                  const std::optional<std::string>& prefix, Split split,
                  std::pair<double, double> bookend, std::optional<int64_t> num_samples,
                  const SplitInfo& info)
      : low_(std::move(low)), class_name_(prefix ? "GPTDataset" : "MockGPTDataset") {
    // MegatronDataset.unique_identifiers: the keys and their order are Megatron's.
    identifiers_ = PyJson::object({{"class", PyJson(class_name_)},
                                   {"dataset_path", prefix ? PyJson(*prefix) : PyJson()},
                                   {"num_samples", optional_int(num_samples)},
                                   {"index_split", PyJson(std::string(split_name(split)))},
                                   {"random_seed", PyJson(static_cast<int64_t>(c.seed))},
                                   {"sequence_length", PyJson(static_cast<int64_t>(c.seq_length))},
                                   {"split", info.split},
                                   {"split_matrix", info.split_matrix},
                                   {"tokenizer", c.tokenizer_identifiers}});
    description_ = identifiers_.dumps(4);
    hash_ = md5_hex(description_);

    const int64_t n = static_cast<int64_t>(low_->sizes.size());
    const auto [beg, end] = split_index_range(bookend, n);
    std::vector<int32_t> indexed_indices;
    for (int64_t i = beg; i < end; ++i) indexed_indices.push_back(static_cast<int32_t>(i));

    GPTIndexConfig ic;
    ic.sequence_length = c.seq_length;
    ic.add_extra_token_to_sequence = c.add_extra_token_to_sequence ? 1 : 0;
    ic.random_seed = c.seed;
    ic.drop_last_partial_sequence =
        split == Split::valid ? c.drop_last_partial_validation_sequence : true;
    ic.validate();
    GPTSampleConfig sc;
    sc.pad_id = c.pad_id == c.eod_id ? -1 : c.pad_id;  // Megatron: a colliding pad becomes -1
    if (c.eod_id >= 0) sc.eod_id = c.eod_id;
    sc.eod_mask_loss = c.eod_mask_loss;
    sc.reset_position_ids = c.reset_position_ids;
    sc.reset_attention_mask = c.reset_attention_mask;

    // Megatron: --data-cache-path, else <prefix>/cache/GPTDataset_indices for real data only.
    std::optional<std::string> dir = c.data_cache_path;
    if (!dir && prefix)
      dir = (std::filesystem::path(*prefix) / "cache" / (class_name_ + "_indices")).string();

    auto build = [&]() {
      GPTIndices idx = build_gpt_indices(low_->sizes, indexed_indices, num_samples, ic);
      return to_arrays(idx);
    };
    std::vector<NpyArray> arrays;
    if (dir) {
      const std::string base = cache_base_path(*dir, description_, class_name_, split_name(split));
      arrays = load_or_build_cached(base, description_,
                                    {"document_index", "sample_index", "shuffle_index"}, build);
    } else {
      arrays = build();
    }
    GPTIndices idx;
    for (int64_t v : arrays[0].to_int64()) {
      MG_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
               "GPTDataset: document_index entry " << v << " does not fit int32");
      idx.document_index.push_back(static_cast<int32_t>(v));
    }
    MG_CHECK(arrays[1].shape.size() == 2 && arrays[1].shape[1] == 2,
             "GPTDataset: the cached sample_index is not of shape (n, 2)");
    idx.sample_index = arrays[1].to_int64();
    idx.shuffle_index = arrays[2].to_int64();
    dataset_ = std::make_unique<GPTDataset>(*low_->source, std::move(indexed_indices),
                                            std::move(idx), ic, sc);
    // BlendedMegatronDatasetBuilder.build's check.
    MG_CHECK(!num_samples || dataset_->size() == 0 || *num_samples <= dataset_->size(),
             class_name_ << " " << split_name(split) << ": built " << dataset_->size()
                         << " samples, fewer than the " << *num_samples << " requested");
  }

  int64_t size() const override { return dataset_->size(); }
  GPTSample get(int64_t k) const override { return dataset_->get(k); }
  std::string_view class_name() const override { return class_name_; }
  const std::string& unique_description() const override { return description_; }
  const std::string& unique_description_hash() const override { return hash_; }
  const PyJson& identifiers() const { return identifiers_; }

 private:
  // The arrays with Megatron's element types (helpers.py / _build_shuffle_index).
  std::vector<NpyArray> to_arrays(const GPTIndices& idx) const {
    std::vector<int64_t> doc(idx.document_index.begin(), idx.document_index.end());
    const int64_t n_rows = static_cast<int64_t>(idx.sample_index.size() / 2);
    int64_t max_size = 0;
    for (int32_t s : low_->sizes) max_size = std::max<int64_t>(max_size, s);
    const int64_t sample_idx_max = std::max<int64_t>(static_cast<int64_t>(doc.size()), max_size);
    const bool sample32 = sample_idx_max <= std::numeric_limits<int32_t>::max();
    const int64_t total = static_cast<int64_t>(idx.shuffle_index.size());
    const bool shuffle_u32 = total < static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1;
    return {make_npy("<i4", {static_cast<int64_t>(doc.size())}, doc),
            make_npy(sample32 ? "<i4" : "<i8", {n_rows, 2}, idx.sample_index),
            make_npy(shuffle_u32 ? "<u4" : "<i8", {total}, idx.shuffle_index)};
  }

  std::shared_ptr<const LowLevelDataset> low_;
  std::string class_name_;
  PyJson identifiers_;
  std::string description_;
  std::string hash_;
  std::unique_ptr<GPTDataset> dataset_;
};

// A BlendedDataset over GPTSplitDatasets of one split.
class BlendedSplitDataset final : public MegatronDataset {
 public:
  // weights: normalised floats (greedy, size given), or the children's lengths (exhaustive when
  // size is absent, greedy over min(size, sum) otherwise), as BlendedDataset.__init__ gets them.
  BlendedSplitDataset(const DataConfig& c, std::vector<std::shared_ptr<const GPTSplitDataset>> ds,
                      std::vector<double> weights, bool weights_are_lengths,
                      std::optional<int64_t> size, Split split)
      : datasets_(std::move(ds)) {
    MG_CHECK(!datasets_.empty() && datasets_.size() < 32767,
             "BlendedDataset: " << datasets_.size() << " datasets, expected 1 to 32766");
    for (std::size_t i = 0; i < weights.size(); ++i)
      MG_CHECK(weights[i] > 0, "BlendedDataset (" << split_name(split) << "): dataset " << i << " ("
                                                  << datasets_[i]->unique_description_hash()
                                                  << ") has weight " << weights[i]
                                                  << "; every weight (or length) must be > 0");
    // BlendedDataset.__init__ normalises again when size is given.
    if (size) weights = normalize_weights(weights);
    PyJson::Array ids, w;
    for (const auto& d : datasets_) ids.push_back(d->identifiers());
    for (double x : weights)
      w.push_back(size || !weights_are_lengths ? PyJson(x) : PyJson(static_cast<int64_t>(x)));
    description_ = PyJson::object({{"class", PyJson("BlendedDataset")},
                                   {"datasets", PyJson::array(std::move(ids))},
                                   {"split", PyJson(std::string(split_name(split)))},
                                   {"weights", PyJson::array(std::move(w))},
                                   {"size", optional_int(size)}})
                       .dumps(4);
    hash_ = md5_hex(description_);

    std::vector<int64_t> lengths;
    for (const auto& d : datasets_) lengths.push_back(d->size());
    auto build = [&]() {
      BlendingIndices bi;
      if (size) {
        bi = build_blending_indices(weights, *size);
      } else {
        std::vector<int64_t> sizes;
        for (double x : weights) sizes.push_back(static_cast<int64_t>(x));
        bi = build_exhaustive_blending_indices(sizes);
      }
      const int64_t n = static_cast<int64_t>(bi.dataset_index.size());
      std::vector<int64_t> di(bi.dataset_index.begin(), bi.dataset_index.end());
      return std::vector<NpyArray>{make_npy("<i2", {n}, di),
                                   make_npy("<i8", {n}, bi.dataset_sample_index)};
    };
    std::vector<NpyArray> arrays;
    if (c.data_cache_path) {  // Megatron caches blends only under an explicit path
      const std::string base =
          cache_base_path(*c.data_cache_path, description_, "BlendedDataset", split_name(split));
      arrays = load_or_build_cached(base, description_, {"dataset_index", "dataset_sample_index"},
                                    build);
    } else {
      arrays = build();
    }
    for (int64_t v : arrays[0].to_int64())
      indices_.dataset_index.push_back(static_cast<int16_t>(v));
    indices_.dataset_sample_index = arrays[1].to_int64();
    MG_CHECK(indices_.dataset_index.size() == indices_.dataset_sample_index.size(),
             "BlendedDataset: dataset_index and dataset_sample_index differ in length");
    MG_CHECK(!size || static_cast<int64_t>(indices_.dataset_index.size()) == *size,
             "BlendedDataset: " << indices_.dataset_index.size() << " samples, expected " << *size);
    std::vector<std::string> names;
    for (const auto& d : datasets_) {
      std::string name = std::string(d->class_name()) + " " + d->unique_description_hash();
      names.push_back(name);
    }
    check_blend_bounds(indices_, lengths, names);
  }

  int64_t size() const override { return static_cast<int64_t>(indices_.dataset_index.size()); }
  GPTSample get(int64_t k) const override {
    MG_CHECK(k >= 0 && k < size(),
             "BlendedDataset: sample " << k << " out of [0, " << size() << ")");
    const std::size_t i = static_cast<std::size_t>(k);
    return datasets_[static_cast<std::size_t>(indices_.dataset_index[i])]->get(
        indices_.dataset_sample_index[i]);
  }
  std::string_view class_name() const override { return "BlendedDataset"; }
  const std::string& unique_description() const override { return description_; }
  const std::string& unique_description_hash() const override { return hash_; }

 private:
  std::vector<std::shared_ptr<const GPTSplitDataset>> datasets_;
  BlendingIndices indices_;
  std::string description_;
  std::string hash_;
};

using GPTSplits = std::array<std::shared_ptr<const GPTSplitDataset>, 3>;

// _build_megatron_dataset_splits: one low-level dataset, one GPT dataset per present split.
GPTSplits build_megatron_dataset_splits(const DataConfig& c,
                                        const std::optional<std::string>& prefix,
                                        const SplitBookends& bookends,
                                        const std::array<std::optional<int64_t>, 3>& sizes,
                                        const SplitInfo& info) {
  GPTSplits out;
  auto low = build_low_level(c, prefix);
  for (Split s : kSplits) {
    const std::size_t i = static_cast<std::size_t>(s);
    if (!bookends[i]) continue;
    try {
      out[i] = std::make_shared<GPTSplitDataset>(c, low, prefix, s, *bookends[i], sizes[i], info);
    } catch (const Error& e) {
      // Name the split and the file (a too-small or empty split says neither by itself).
      MG_THROW("the " << split_name(s) << " split of "
                      << (prefix ? "'" + *prefix + "' (.bin/.idx)" : std::string("the mock data"))
                      << ": " << e.message());
    }
  }
  return out;
}

// _get_size_per_split_per_dataset for one dataset: ceil(ceil(n * w) * (1 + surplus)).
int64_t size_for(double w, int64_t n, double surplus) {
  return static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(n) * w) * (1.0 + surplus)));
}

// One split's blend over `prefixes` (weights normalised, or absent): children built with
// `bookends` and the per-split `sizes`, then the top-level dataset of split `s`.
std::shared_ptr<const MegatronDataset> blend_split(
    Split s, const std::vector<std::vector<std::shared_ptr<const GPTSplitDataset>>>& children,
    const std::optional<std::vector<double>>& weights, std::optional<int64_t> size,
    const DataConfig& c) {
  const std::size_t i = static_cast<std::size_t>(s);
  std::vector<std::shared_ptr<const GPTSplitDataset>> ds;
  for (const auto& per_prefix : children) ds.push_back(per_prefix[i]);
  if (weights) {
    MG_CHECK(size.has_value(), "the " << split_name(s)
                                      << " blend has weights but no sample count; weighted "
                                         "blends need a size for every split");
    int64_t total = 0;  // sum of the targets (no surplus)
    for (double w : *weights) total += size_for(w, *size, 0.0);
    return std::make_shared<BlendedSplitDataset>(c, ds, *weights, false, total, s);
  }
  std::vector<double> lengths;
  int64_t sum = 0;
  for (const auto& d : ds) {
    lengths.push_back(static_cast<double>(d->size()));
    sum += d->size();
  }
  std::optional<int64_t> top = size ? std::optional<int64_t>(std::min(*size, sum)) : std::nullopt;
  return std::make_shared<BlendedSplitDataset>(c, ds, lengths, true, top, s);
}

}  // namespace

std::string_view split_name(Split split) {
  switch (split) {
    case Split::train:
      return "train";
    case Split::valid:
      return "valid";
    case Split::test:
      return "test";
  }
  MG_CHECK(false, "split_name: invalid Split " << static_cast<int>(split));
  return "";
}

void DataConfig::validate() const {
  const bool per_split =
      !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  MG_CHECK(!(per_split && !data_path.empty()),
           "DataConfig: --data-path and --train/valid/test-data-path are exclusive");
  MG_CHECK(!(mock && (per_split || !data_path.empty())),
           "DataConfig: --mock-data and --data-path / --train/valid/test-data-path are exclusive");
  MG_CHECK(!(per_split && split.has_value()),
           "DataConfig: --split \"" << *split << "\" cannot be used with "
                                    << "--train/valid/test-data-path (each file is used whole)");
  MG_CHECK(seq_length > 0, "DataConfig: --seq-length must be > 0, got " << seq_length);
  if (eod_mask_loss || reset_position_ids || reset_attention_mask)
    MG_CHECK(eod_id >= 0,
             "DataConfig: --eod-mask-loss / --reset-position-ids / "
             "--reset-attention-mask need the tokenizer's EOD id, got eod_id "
                 << eod_id);
  if (mock || (data_path.empty() && !per_split)) {
    MG_CHECK(vocab_size > 0,
             "DataConfig: mock data needs the tokenizer's vocab_size > 0, got " << vocab_size);
    MG_CHECK(eod_id >= 0,
             "DataConfig: mock data needs the tokenizer's EOD id >= 0, got " << eod_id);
  }
  MG_CHECK(pad_id >= -1, "DataConfig: pad_id must be a token id or -1, got " << pad_id);
  MG_CHECK(
      std::isfinite(mid_level_dataset_surplus) && mid_level_dataset_surplus >= 0.0,
      "DataConfig: --mid-level-dataset-surplus must be >= 0, got " << mid_level_dataset_surplus);
  if (data_cache_path)
    MG_CHECK(!data_cache_path->empty(), "DataConfig: --data-cache-path is set but empty");
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream in{std::string(text)};
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::array<std::optional<int64_t>, 3> megatron_split_sizes(int64_t train_iters,
                                                           int64_t global_batch_size,
                                                           int64_t eval_interval,
                                                           int64_t eval_iters,
                                                           std::optional<int64_t> train_samples) {
  MG_CHECK(global_batch_size > 0,
           "megatron_split_sizes: global_batch_size must be > 0, got " << global_batch_size);
  MG_CHECK(eval_interval > 0,
           "megatron_split_sizes: eval_interval must be > 0, got " << eval_interval);
  MG_CHECK(train_iters >= 0 && eval_iters >= 0, "megatron_split_sizes: train_iters "
                                                    << train_iters << " and eval_iters "
                                                    << eval_iters << " must be >= 0");
  MG_CHECK(!train_samples || *train_samples >= 0,
           "megatron_split_sizes: train_samples must be >= 0, got " << *train_samples);
  const int64_t train = train_samples ? *train_samples : train_iters * global_batch_size;
  return {train, (train_iters / eval_interval + 1) * eval_iters * global_batch_size,
          eval_iters * global_batch_size};
}

BlendedMegatronDatasetBuilder::BlendedMegatronDatasetBuilder(
    DataConfig config, std::array<std::optional<int64_t>, 3> sizes)
    : config_(std::move(config)), sizes_(sizes) {
  config_.validate();
  for (Split s : kSplits) {
    const auto& n = sizes_[static_cast<std::size_t>(s)];
    MG_CHECK(!n || *n >= 0, "BlendedMegatronDatasetBuilder: the " << split_name(s) << " size is "
                                                                  << *n << ", must be >= 0");
  }
}

DatasetSplits BlendedMegatronDatasetBuilder::build() const {
  const DataConfig& c = config_;
  DatasetSplits out;
  const bool per_split =
      !c.train_data_path.empty() || !c.valid_data_path.empty() || !c.test_data_path.empty();
  auto assign = [&out](const GPTSplits& g) {
    for (std::size_t i = 0; i < 3; ++i) out[i] = g[i];
  };

  if (!per_split && c.data_path.empty()) {  // mock
    const SplitBookends m = parse_split(kMockGPTSplit);
    assign(build_megatron_dataset_splits(c, std::nullopt, m, sizes_,
                                         {PyJson(kMockGPTSplit), split_matrix_json(m)}));
    return out;
  }

  if (!per_split) {  // one distribution for every split
    const std::string split = c.split.value_or(kDefaultSplit);
    const SplitBookends m = parse_split(split);
    const SplitInfo info{PyJson(split), split_matrix_json(m)};
    const BlendSpec spec = parse_blend(c.data_path);
    if (spec.prefixes.size() == 1 && !spec.weights) {
      assign(build_megatron_dataset_splits(c, spec.prefixes[0], m, sizes_, info));
      return out;
    }
    std::optional<std::vector<double>> w;
    if (spec.weights) {
      w = normalize_weights(*spec.weights);
      for (Split s : kSplits)
        MG_CHECK(sizes_[static_cast<std::size_t>(s)].has_value(),
                 "a weighted --data-path blend needs a sample count for every split; the "
                     << split_name(s) << " count is unset");
    }
    std::vector<std::vector<std::shared_ptr<const GPTSplitDataset>>> children;
    for (std::size_t p = 0; p < spec.prefixes.size(); ++p) {
      std::array<std::optional<int64_t>, 3> buffer{};  // one epoch when unweighted
      if (w)
        for (std::size_t i = 0; i < 3; ++i)
          buffer[i] = size_for((*w)[p], *sizes_[i], c.mid_level_dataset_surplus);
      const GPTSplits g = build_megatron_dataset_splits(c, spec.prefixes[p], m, buffer, info);
      children.emplace_back(g.begin(), g.end());
    }
    for (Split s : kSplits) {
      const std::size_t i = static_cast<std::size_t>(s);
      if (m[i]) out[i] = blend_split(s, children, w, sizes_[i], c);
    }
    return out;
  }

  // Each split from its own distribution; each file is used whole.
  const SplitInfo info{PyJson(), PyJson()};  // config.split and split_matrix are None
  const std::array<const std::vector<std::string>*, 3> paths = {
      &c.train_data_path, &c.valid_data_path, &c.test_data_path};
  for (Split s : kSplits) {
    const std::size_t i = static_cast<std::size_t>(s);
    if (paths[i]->empty()) continue;
    SplitBookends spoof{};
    spoof[i] = std::make_pair(0.0, 1.0);
    std::array<std::optional<int64_t>, 3> sizes_spoof{int64_t{0}, int64_t{0}, int64_t{0}};
    sizes_spoof[i] = sizes_[i];
    const BlendSpec spec = parse_blend(*paths[i]);
    if (spec.prefixes.size() == 1) {  // even with a weight, as Megatron does
      out[i] = build_megatron_dataset_splits(c, spec.prefixes[0], spoof, sizes_spoof, info)[i];
      continue;
    }
    std::optional<std::vector<double>> w;
    if (spec.weights) {
      MG_CHECK(sizes_[i].has_value(),
               "the weighted --" << split_name(s) << "-data-path blend needs a sample count");
      w = normalize_weights(*spec.weights);
    }
    std::vector<std::vector<std::shared_ptr<const GPTSplitDataset>>> children;
    for (std::size_t p = 0; p < spec.prefixes.size(); ++p) {
      std::array<std::optional<int64_t>, 3> buffer{};
      if (w) buffer[i] = size_for((*w)[p], *sizes_[i], c.mid_level_dataset_surplus);
      const GPTSplits g = build_megatron_dataset_splits(c, spec.prefixes[p], spoof, buffer, info);
      children.emplace_back(g.begin(), g.end());
    }
    out[i] = blend_split(s, children, w, sizes_[i], c);
  }
  return out;
}

}  // namespace mg::datasets
