// Megatron's GPT dataset indices and sample fetch (see gpt_dataset.h). Line-for-line ports of
// megatron/core/datasets/{gpt_dataset.py, helpers.cpp, utils.py}; comments mark where the C++
// deliberately differs (errors instead of Python asserts or silent misparses).
#include "megatron/core/datasets/gpt_dataset.h"
#include "megatron/core/common/progress.h"

#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

#include "megatron/core/common/error.h"

namespace mg::datasets {

SplitBookends parse_split(std::string_view split) {
  std::vector<double> weights;
  for (std::size_t i = 0; i < split.size();) {
    const char c = split[i];
    if (c != '.' && (c < '0' || c > '9')) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < split.size() && (split[j] == '.' || (split[j] >= '0' && split[j] <= '9'))) ++j;
    const std::string token(split.substr(i, j - i));
    // Megatron's regex drops the '-' and reads "-1" as 1; a negative weight is an error here.
    MG_CHECK(i == 0 || split[i - 1] != '-', "parse_split: split weights must be >= 0, got -"
                                                << token << " in \"" << split << "\"");
    char* end = nullptr;
    const double v = std::strtod(token.c_str(), &end);
    MG_CHECK(end == token.c_str() + token.size(),
             "parse_split: \"" << token << "\" in \"" << split << "\" is not a number");
    weights.push_back(v);
    i = j;
  }
  MG_CHECK(weights.size() <= 3, "parse_split: at most 3 weights (train, valid, test), got "
                                    << weights.size() << " in \"" << split << "\"");
  weights.resize(3, 0.0);
  const double sum = weights[0] + weights[1] + weights[2];  // numpy.sum: sequential for 3
  MG_CHECK(sum > 0.0, "parse_split: the weights of \"" << split << "\" sum to zero");
  SplitBookends out;
  double start = 0.0;  // Python starts the cumulation at the integer 0: 0 + w0 == w0 exactly.
  for (int s = 0; s < 3; ++s) {
    const double end = start + weights[s] / sum;
    if (end > start) out[s] = std::make_pair(start, end);
    start = end;
  }
  return out;
}

std::pair<int64_t, int64_t> split_index_range(std::pair<double, double> bookend, int64_t n) {
  MG_CHECK(n >= 0, "split_index_range: sequence count must be >= 0, got " << n);
  // Python round() is round-half-to-even: nearbyint under the default rounding mode.
  MG_CHECK(std::fegetround() == FE_TONEAREST, "split_index_range: FP rounding mode is not nearest");
  const double nd = static_cast<double>(n);
  return {static_cast<int64_t>(std::nearbyint(bookend.first * nd)),
          static_cast<int64_t>(std::nearbyint(bookend.second * nd))};
}

void GPTIndexConfig::validate() const {
  MG_CHECK(sequence_length > 0,
           "GPTIndexConfig: sequence_length must be > 0, got " << sequence_length);
  MG_CHECK(add_extra_token_to_sequence == 0 || add_extra_token_to_sequence == 1,
           "GPTIndexConfig: add_extra_token_to_sequence must be 0 or 1, got "
               << add_extra_token_to_sequence);
}

int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                       const GPTIndexConfig& config) {
  config.validate();
  if (!num_samples) return 1;
  MG_CHECK(*num_samples >= 0, "gpt_num_epochs: num_samples must be >= 0, got " << *num_samples);
  const int64_t requested =
      *num_samples * config.sequence_length + config.add_extra_token_to_sequence;
  if (requested <= tokens_per_epoch) return 1;
  // Megatron loops forever here on an empty split.
  MG_CHECK(tokens_per_epoch > 0, "gpt_num_epochs: the split has no tokens, cannot produce "
                                     << *num_samples << " samples of " << config.sequence_length
                                     << " tokens");
  return (requested + tokens_per_epoch - 1) / tokens_per_epoch;
}

std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch) {
  MG_CHECK(num_epochs >= 1, "build_document_index: num_epochs must be >= 1, got " << num_epochs);
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> index;
    index.reserve(documents.size() * static_cast<std::size_t>(num_epochs));
    for (int64_t e = 0; e < num_epochs; ++e)
      index.insert(index.end(), documents.begin(), documents.end());
    rng.shuffle(index);
    return index;
  }
  std::vector<int32_t> first = build_document_index(documents, num_epochs - 1, rng, false);
  const std::vector<int32_t> last = build_document_index(documents, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes,
                                        std::span<const int32_t> document_index,
                                        int32_t sequence_length, int32_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        int32_t add_extra_token_to_sequence) {
  MG_CHECK(sequence_length > 0,
           "build_sample_index: sequence_length must be > 0, got " << sequence_length);
  const int64_t x = add_extra_token_to_sequence;
  const int64_t total = static_cast<int64_t>(num_epochs) * tokens_per_epoch - x;
  int64_t num_samples = 0;
  if (drop_last_partial_sequence) {
    num_samples = total / sequence_length;
  } else {
    // helpers.cpp: ceil(float(...) / seq_length) in single precision.
    num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(total) / static_cast<float>(sequence_length)));
  }
  MG_CHECK(num_samples >= 0, "build_sample_index: " << num_epochs << " epochs of "
                                                    << tokens_per_epoch
                                                    << " tokens give no sample");
  MG_CHECK(num_samples == 0 || !document_index.empty(),
           "build_sample_index: document_index is empty but " << num_samples << " samples needed");
  for (const int32_t id : document_index) {
    MG_CHECK(id >= 0 && static_cast<std::size_t>(id) < sizes.size(),
             "build_sample_index: document id " << id << " is outside the " << sizes.size()
                                                << " sequence lengths");
  }
  std::vector<int64_t> out(2 * static_cast<std::size_t>(num_samples + 1));
  int64_t d = 0;
  int64_t offset = 0;
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  Progress progress("building the sample index", num_samples);
  for (int64_t j = 1; j <= num_samples; ++j) {
    if ((j & 0xffff) == 0) progress.update(j);
    int64_t remaining = sequence_length + x;
    while (remaining != 0) {
      const int64_t length = sizes[static_cast<std::size_t>(document_index[d])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - x;
        remaining = 0;
      } else {
        if (d == last) {
          // Only the last, partial sample can run out (helpers.cpp asserts it).
          MG_CHECK(j == num_samples, "build_sample_index: ran out of tokens at sample "
                                         << j << " of " << num_samples
                                         << "; tokens_per_epoch does not match sizes");
          offset = sizes[static_cast<std::size_t>(document_index[d])] - x;
          break;
        }
        ++d;
        offset = 0;
      }
    }
    out[2 * static_cast<std::size_t>(j)] = d;
    out[2 * static_cast<std::size_t>(j) + 1] = offset;
  }
  progress.update(num_samples);
  return out;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         NumpyRandomState& rng) {
  MG_CHECK(num_samples >= 0 && num_samples <= total_size,
           "build_shuffle_index: need 0 <= num_samples <= total_size, got "
               << num_samples << " and " << total_size);
  std::vector<int64_t> index(static_cast<std::size_t>(total_size));
  for (int64_t i = 0; i < total_size; ++i) index[static_cast<std::size_t>(i)] = i;
  std::span<int64_t> all(index);
  rng.shuffle(all.first(static_cast<std::size_t>(num_samples)));
  if (num_samples != total_size) rng.shuffle(all.subspan(static_cast<std::size_t>(num_samples)));
  return index;
}

GPTIndices build_gpt_indices(std::span<const int32_t> sizes,
                             std::span<const int32_t> indexed_indices,
                             std::optional<int64_t> num_samples, const GPTIndexConfig& config) {
  config.validate();
  GPTIndices out;
  for (const int32_t id : indexed_indices) {
    MG_CHECK(id >= 0 && static_cast<std::size_t>(id) < sizes.size(),
             "build_gpt_indices: sequence id " << id << " is outside [0, " << sizes.size() << ")");
    MG_CHECK(sizes[static_cast<std::size_t>(id)] >= 0, "build_gpt_indices: sequence "
                                                           << id << " has negative length "
                                                           << sizes[static_cast<std::size_t>(id)]);
    out.tokens_per_epoch += sizes[static_cast<std::size_t>(id)];
  }
  const int64_t T = out.tokens_per_epoch;
  const int64_t S = config.sequence_length;
  const int64_t x = config.add_extra_token_to_sequence;
  MG_CHECK(T >= x, "build_gpt_indices: the split has " << T << " tokens, fewer than the " << x
                                                       << " extra token of every sample");
  out.num_epochs = gpt_num_epochs(T, num_samples, config);
  MG_CHECK(out.num_epochs <= std::numeric_limits<int32_t>::max(),
           "build_gpt_indices: " << out.num_epochs << " epochs do not fit helpers.cpp's int32");
  if (out.num_epochs > 1) {
    const int64_t E = out.num_epochs;
    out.num_samples_sans_final_epoch = ((E - 1) * T - x) / S;
    const int64_t n_final = *num_samples - out.num_samples_sans_final_epoch;
    const int64_t n_per_epoch = (T - x) / S;
    MG_CHECK(n_final >= 0 && n_final <= n_per_epoch + 1,
             "build_gpt_indices: " << n_final << " samples from the final epoch, outside [0, "
                                   << n_per_epoch + 1 << "]");
    // int(0.80 * n): truncation of a float64 product, as Python does.
    out.separate_final_epoch =
        n_final < static_cast<int64_t>(0.80 * static_cast<double>(n_per_epoch));
  }
  NumpyRandomState rng(config.random_seed);
  out.document_index =
      build_document_index(indexed_indices, out.num_epochs, rng, out.separate_final_epoch);
  out.sample_index = build_sample_index(
      sizes, out.document_index, config.sequence_length, static_cast<int32_t>(out.num_epochs), T,
      config.drop_last_partial_sequence, config.add_extra_token_to_sequence);
  const int64_t n = out.num_samples();
  out.shuffle_index =
      build_shuffle_index(out.separate_final_epoch ? out.num_samples_sans_final_epoch : n, n, rng);
  return out;
}

int64_t IndexedDatasetSource::sequence_length(std::size_t i) const {
  MG_CHECK(i < dataset_.sequence_count(),
           "IndexedDatasetSource: sequence " << i << " out of " << dataset_.sequence_count());
  return dataset_.sequence_lengths()[i];
}

std::vector<int64_t> IndexedDatasetSource::read(std::size_t i, int64_t offset,
                                                int64_t length) const {
  MG_CHECK(offset >= 0 && length >= 0, "IndexedDatasetSource: offset " << offset << " and length "
                                                                       << length
                                                                       << " must be >= 0");
  return dataset_.get(i, static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
}

GPTDataset::GPTDataset(const SequenceSource& source, std::vector<int32_t> indexed_indices,
                       std::optional<int64_t> num_samples, GPTIndexConfig config,
                       GPTSampleConfig sample_config)
    : source_(source),
      indexed_indices_(std::move(indexed_indices)),
      config_(config),
      sample_config_(sample_config) {
  const std::size_t n = source_.sequence_count();
  MG_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int32_t>::max()),
           "GPTDataset: " << n << " sequences do not fit int32 document ids");
  std::vector<int32_t> sizes(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t len = source_.sequence_length(i);
    MG_CHECK(len >= 0 && len <= std::numeric_limits<int32_t>::max(),
             "GPTDataset: sequence " << i << " has length " << len << ", outside int32");
    sizes[i] = static_cast<int32_t>(len);
  }
  sample_config_.validate();
  indices_ = build_gpt_indices(sizes, indexed_indices_, num_samples, config_);
}

GPTDataset::GPTDataset(const SequenceSource& source, std::vector<int32_t> indexed_indices,
                       GPTIndices indices, GPTIndexConfig config, GPTSampleConfig sample_config)
    : source_(source),
      indexed_indices_(std::move(indexed_indices)),
      config_(config),
      sample_config_(sample_config),
      indices_(std::move(indices)) {
  config_.validate();
  sample_config_.validate();
  const int64_t n_seq = static_cast<int64_t>(source_.sequence_count());
  const std::vector<int32_t>& doc = indices_.document_index;
  for (std::size_t d = 0; d < doc.size(); ++d)
    MG_CHECK(doc[d] >= 0 && doc[d] < n_seq, "GPTDataset: document_index[" << d << "] = " << doc[d]
                                                                          << " is outside [0, "
                                                                          << n_seq << ")");
  const std::vector<int64_t>& si = indices_.sample_index;
  MG_CHECK(si.size() >= 2 && si.size() % 2 == 0,
           "GPTDataset: sample_index has " << si.size() << " entries, expected 2 * (n + 1) >= 2");
  const int64_t x = config_.add_extra_token_to_sequence;
  for (std::size_t r = 0; r < si.size() / 2; ++r) {
    const int64_t d = si[2 * r], off = si[2 * r + 1];
    MG_CHECK(d >= 0 && d < static_cast<int64_t>(doc.size()),
             "GPTDataset: sample_index row " << r << " names document_index position " << d
                                             << ", outside [0, " << doc.size() << ")");
    const int64_t len = source_.sequence_length(static_cast<std::size_t>(doc[d]));
    MG_CHECK(off >= 0 && off + (r > 0 ? x : 0) <= len,
             "GPTDataset: sample_index row " << r << " offset " << off
                                             << " does not fit its sequence of length " << len);
    if (r > 0) {
      const int64_t pd = si[2 * r - 2], poff = si[2 * r - 1];
      MG_CHECK(d > pd || (d == pd && off >= poff), "GPTDataset: sample_index row "
                                                       << r << " (" << d << ", " << off
                                                       << ") goes backwards from (" << pd << ", "
                                                       << poff << ")");
    }
  }
  const int64_t n = indices_.num_samples();
  MG_CHECK(static_cast<int64_t>(indices_.shuffle_index.size()) == n,
           "GPTDataset: shuffle_index has " << indices_.shuffle_index.size() << " entries for " << n
                                            << " samples");
  for (std::size_t k = 0; k < indices_.shuffle_index.size(); ++k)
    MG_CHECK(indices_.shuffle_index[k] >= 0 && indices_.shuffle_index[k] < n,
             "GPTDataset: shuffle_index[" << k << "] = " << indices_.shuffle_index[k]
                                          << " is outside [0, " << n << ")");
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> GPTDataset::raw_sample(int64_t k) const {
  MG_CHECK(k >= 0 && k < size(), "GPTDataset: sample " << k << " out of [0, " << size() << ")");
  const int64_t x = config_.add_extra_token_to_sequence;
  const std::size_t j =
      static_cast<std::size_t>(indices_.shuffle_index[static_cast<std::size_t>(k)]);
  const int64_t d0 = indices_.sample_index[2 * j], o0 = indices_.sample_index[2 * j + 1];
  const int64_t d1 = indices_.sample_index[2 * j + 2], o1 = indices_.sample_index[2 * j + 3];
  std::vector<int64_t> text;
  std::vector<int64_t> ids;
  for (int64_t d = d0; d <= d1; ++d) {
    const int32_t id = indices_.document_index[static_cast<std::size_t>(d)];
    const int64_t begin = d == d0 ? o0 : 0;
    const int64_t end = d == d1 ? o1 + x : source_.sequence_length(static_cast<std::size_t>(id));
    const std::vector<int64_t> part =
        source_.read(static_cast<std::size_t>(id), begin, end - begin);
    text.insert(text.end(), part.begin(), part.end());
    ids.push_back(id);
  }
  const std::size_t want = static_cast<std::size_t>(config_.sequence_length + x);
  MG_CHECK(text.size() <= want,
           "GPTDataset: sample " << k << " read " << text.size() << " tokens, more than " << want);
  text.resize(want, sample_config_.pad_id);  // only partial samples are short
  return {std::move(text), std::move(ids)};
}

void GPTSampleConfig::validate() const {
  if (eod_mask_loss || reset_position_ids || reset_attention_mask)
    MG_CHECK(eod_id.has_value(),
             "GPTSampleConfig: --eod-mask-loss, --reset-position-ids and --reset-attention-mask "
             "need the tokenizer's EOD id (eod_id is unset)");
}

GPTSample make_gpt_sample(std::vector<int64_t> text, int64_t sequence_length,
                          int32_t add_extra_token_to_sequence, const GPTSampleConfig& config) {
  config.validate();
  const int64_t x = add_extra_token_to_sequence;
  MG_CHECK(sequence_length > 0 && (x == 0 || x == 1),
           "make_gpt_sample: sequence_length " << sequence_length << " must be > 0 and "
                                               << "add_extra_token_to_sequence " << x << " 0 or 1");
  MG_CHECK(static_cast<int64_t>(text.size()) == sequence_length + x,
           "make_gpt_sample: " << text.size()
                               << " tokens of text, expected S + x = " << sequence_length + x);
  GPTSample s;
  s.text = std::move(text);
  const std::size_t S = static_cast<std::size_t>(sequence_length);
  const int64_t pad = config.pad_id;
  if (x == 1) {
    s.tokens.assign(s.text.begin(), s.text.begin() + static_cast<std::ptrdiff_t>(S));
    s.labels.assign(s.text.begin() + 1, s.text.end());
  } else {
    s.tokens = s.text;
    s.labels.assign(s.text.begin() + 1, s.text.end());
    s.labels.push_back(pad);
  }
  // _get_ltor_masks_and_position_ids on tokens, before pads are replaced by 0.
  s.loss_mask.assign(S, 1.0f);
  s.position_ids.resize(S);
  if (config.reset_attention_mask) s.doc_ids.resize(S);
  const int64_t eod = config.eod_id.value_or(0);
  const bool track_eod = config.eod_id.has_value();
  int64_t doc_start = 0;  // position of the first token of the current document
  int32_t doc = 0;
  for (std::size_t i = 0; i < S; ++i) {
    const bool is_eod = track_eod && s.tokens[i] == eod;
    if (config.eod_mask_loss && is_eod) s.loss_mask[i] = 0.0f;
    s.position_ids[i] =
        config.reset_position_ids ? static_cast<int64_t>(i) - doc_start : static_cast<int64_t>(i);
    if (config.reset_attention_mask) s.doc_ids[i] = doc;
    if (is_eod) {  // the EOD ends its document; the next token starts a new one
      doc_start = static_cast<int64_t>(i) + 1;
      ++doc;
    }
  }
  for (std::size_t i = 0; i < S; ++i) {
    if (s.labels[i] == pad) s.loss_mask[i] = 0.0f;
    if (s.tokens[i] == pad) s.tokens[i] = 0;
    if (s.labels[i] == pad) s.labels[i] = 0;
  }
  return s;
}

GPTSample GPTDataset::get(int64_t k) const {
  auto [text, ids] = raw_sample(k);
  GPTSample s = make_gpt_sample(std::move(text), config_.sequence_length,
                                config_.add_extra_token_to_sequence, sample_config_);
  s.document_ids = std::move(ids);
  return s;
}

}  // namespace mg::datasets
