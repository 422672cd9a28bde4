// BlendedDataset and its helpers (see blended_dataset.h). The index loops follow Megatron's
// helpers.cpp build_blending_indices / build_exhaustive_blending_indices statement for statement,
// because the float64 error comparison decides ties and must round the same way.
#include "megatron/core/datasets/blended_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::datasets {
namespace {

// numpy's pairwise_sum for float64 (8-way unrolled blocks, halves above 128 elements).
double pairwise_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (std::size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + static_cast<std::size_t>(j)];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  std::size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// Python float(): the whole (whitespace-trimmed) string must parse.
std::optional<double> parse_float(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return std::nullopt;
  const std::size_t e = s.find_last_not_of(" \t\n\r");
  const std::string t = s.substr(b, e - b + 1);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || (errno == ERANGE && !std::isfinite(v))) return {};
  return v;
}

int16_t to_int16(std::size_t i) {
  return static_cast<int16_t>(i);
}

}  // namespace

BlendSpec parse_blend(std::span<const std::string> data_path) {
  MG_CHECK(!data_path.empty(), "parse_blend: --data-path is empty");
  BlendSpec spec;
  if (data_path.size() % 2 == 0) {
    std::vector<double> w;
    std::vector<std::string> p;
    bool all_numeric = true;
    for (std::size_t i = 0; i < data_path.size(); i += 2) {
      const std::optional<double> v = parse_float(data_path[i]);
      if (!v) {
        all_numeric = false;
        break;
      }
      w.push_back(*v);
      p.push_back(data_path[i + 1]);
    }
    if (all_numeric) {
      spec.prefixes = std::move(p);
      spec.weights = std::move(w);
      return spec;
    }
  }
  spec.prefixes.assign(data_path.begin(), data_path.end());
  return spec;
}

std::vector<double> normalize_weights(std::span<const double> weights) {
  MG_CHECK(!weights.empty(), "normalize_weights: no weights");
  for (std::size_t i = 0; i < weights.size(); ++i)
    MG_CHECK(std::isfinite(weights[i]) && weights[i] >= 0.0,
             "normalize_weights: weight " << i << " is " << weights[i] << ", must be finite >= 0");
  const double sum = pairwise_sum(weights.data(), weights.size());
  MG_CHECK(sum > 0.0, "normalize_weights: the " << weights.size() << " weights sum to " << sum);
  std::vector<double> out(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / sum;
  return out;
}

std::vector<int64_t> blend_num_samples(std::span<const double> normalized_weights, int64_t n,
                                       double surplus) {
  MG_CHECK(n >= 0, "blend_num_samples: target size must be >= 0, got " << n);
  MG_CHECK(surplus >= 0.0, "blend_num_samples: surplus must be >= 0, got " << surplus);
  std::vector<int64_t> out;
  for (double w : normalized_weights) {
    const double target = std::ceil(static_cast<double>(n) * w);
    out.push_back(static_cast<int64_t>(std::ceil(target * (1.0 + surplus))));
  }
  return out;
}

int64_t blended_size(std::span<const double> normalized_weights, int64_t n) {
  int64_t total = 0;
  for (int64_t s : blend_num_samples(normalized_weights, n, 0.0)) total += s;
  return total;
}

BlendingIndices build_blending_indices(std::span<const double> normalized_weights, int64_t size) {
  const std::size_t m = normalized_weights.size();
  MG_CHECK(m >= 1 && m <= static_cast<std::size_t>(std::numeric_limits<int16_t>::max()),
           "build_blending_indices: " << m << " datasets, need 1..32767 (int16 dataset_index)");
  MG_CHECK(size >= 0, "build_blending_indices: size must be >= 0, got " << size);
  BlendingIndices out;
  out.dataset_index.resize(static_cast<std::size_t>(size));
  out.dataset_sample_index.resize(static_cast<std::size_t>(size));
  std::vector<int64_t> count(m, 0);
  for (int64_t s = 0; s < size; ++s) {
    // t = max(s, 1): at s = 0 the errors are the weights themselves, so the heaviest goes first.
    const double t = std::max(static_cast<double>(s), 1.0);
    std::size_t argmax = 0;
    double max_error = normalized_weights[0] * t - static_cast<double>(count[0]);
    for (std::size_t i = 1; i < m; ++i) {
      const double error = normalized_weights[i] * t - static_cast<double>(count[i]);
      if (error > max_error) {
        max_error = error;
        argmax = i;
      }
    }
    out.dataset_index[static_cast<std::size_t>(s)] = to_int16(argmax);
    out.dataset_sample_index[static_cast<std::size_t>(s)] = count[argmax];
    ++count[argmax];
  }
  return out;
}

BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes) {
  const std::size_t m = sizes.size();
  MG_CHECK(m >= 1 && m <= static_cast<std::size_t>(std::numeric_limits<int16_t>::max()),
           "build_exhaustive_blending_indices: " << m << " datasets, need 1..32767");
  int64_t total = 0;
  for (std::size_t i = 0; i < m; ++i) {
    MG_CHECK(sizes[i] >= 0,
             "build_exhaustive_blending_indices: size " << i << " is " << sizes[i] << " < 0");
    total += sizes[i];
  }
  BlendingIndices out;
  if (total == 0) return out;
  std::vector<double> w(m);
  for (std::size_t i = 0; i < m; ++i)
    w[i] = static_cast<double>(sizes[i]) / static_cast<double>(total);
  std::vector<int64_t> count(m, 0);
  std::vector<bool> unspent(m);
  for (std::size_t i = 0; i < m; ++i) unspent[i] = sizes[i] > 0;
  out.dataset_index.reserve(static_cast<std::size_t>(total));
  out.dataset_sample_index.reserve(static_cast<std::size_t>(total));
  for (int64_t s = 0; s < total; ++s) {
    const double t = std::max(static_cast<double>(s), 1.0);
    std::size_t argmax = m;
    double max_error = std::numeric_limits<double>::lowest();
    for (std::size_t i = 0; i < m; ++i) {
      if (!unspent[i]) continue;
      const double error = w[i] * t - static_cast<double>(count[i]);
      if (error > max_error) {
        max_error = error;
        argmax = i;
      }
    }
    out.dataset_index.push_back(to_int16(argmax));
    out.dataset_sample_index.push_back(count[argmax]);
    if (++count[argmax] == sizes[argmax]) unspent[argmax] = false;
  }
  return out;
}

void check_blend_bounds(const BlendingIndices& indices, std::span<const int64_t> dataset_lengths,
                        std::span<const std::string> names) {
  MG_CHECK(indices.dataset_index.size() == indices.dataset_sample_index.size(),
           "check_blend_bounds: dataset_index has " << indices.dataset_index.size()
                                                    << " entries, dataset_sample_index "
                                                    << indices.dataset_sample_index.size());
  std::vector<int64_t> requested(dataset_lengths.size(), 0);
  for (std::size_t k = 0; k < indices.dataset_index.size(); ++k) {
    const int16_t d = indices.dataset_index[k];
    MG_CHECK(d >= 0 && static_cast<std::size_t>(d) < dataset_lengths.size(),
             "check_blend_bounds: sample " << k << " names dataset " << d << " of "
                                           << dataset_lengths.size());
    requested[static_cast<std::size_t>(d)] =
        std::max(requested[static_cast<std::size_t>(d)], indices.dataset_sample_index[k] + 1);
  }
  for (std::size_t i = 0; i < dataset_lengths.size(); ++i) {
    std::ostringstream name;
    if (i < names.size())
      name << "'" << names[i] << "'";
    else
      name << "dataset " << i;
    MG_CHECK(requested[i] <= dataset_lengths[i], "BlendedDataset: the blend asks "
                                                     << name.str() << " for " << requested[i]
                                                     << " samples but it has only "
                                                     << dataset_lengths[i]);
  }
}

BlendedDataset::BlendedDataset(std::vector<const GPTDataset*> datasets,
                               std::optional<std::vector<double>> weights,
                               std::optional<int64_t> size, std::vector<std::string> names)
    : datasets_(std::move(datasets)) {
  MG_CHECK(!datasets_.empty(), "BlendedDataset: no datasets");
  std::vector<int64_t> lengths;
  for (std::size_t i = 0; i < datasets_.size(); ++i) {
    MG_CHECK(datasets_[i] != nullptr, "BlendedDataset: dataset " << i << " is null");
    lengths.push_back(datasets_[i]->size());
  }
  if (weights) {
    MG_CHECK(weights->size() == datasets_.size(),
             "BlendedDataset: " << weights->size() << " weights for " << datasets_.size()
                                << " datasets");
    MG_CHECK(size.has_value(), "BlendedDataset: a weighted blend needs a size");
    weights_ = normalize_weights(*weights);
    indices_ = build_blending_indices(weights_, *size);
  } else {
    std::vector<double> w(lengths.begin(), lengths.end());
    int64_t total = 0;
    for (int64_t l : lengths) total += l;
    weights_ = total > 0 ? normalize_weights(w) : std::vector<double>(w.size(), 0.0);
    if (size) {
      MG_CHECK(total > 0, "BlendedDataset: the datasets are all empty");
      indices_ = build_blending_indices(weights_, std::min(*size, total));
    } else {
      indices_ = build_exhaustive_blending_indices(lengths);
    }
  }
  check_blend_bounds(indices_, lengths, names);
}

std::pair<int64_t, int64_t> BlendedDataset::locate(int64_t k) const {
  MG_CHECK(k >= 0 && k < size(), "BlendedDataset: sample " << k << " out of [0, " << size() << ")");
  return {indices_.dataset_index[static_cast<std::size_t>(k)],
          indices_.dataset_sample_index[static_cast<std::size_t>(k)]};
}

BlendedSample BlendedDataset::get(int64_t k) const {
  const auto [d, s] = locate(k);
  return {datasets_[static_cast<std::size_t>(d)]->get(s), d};
}

}  // namespace mg::datasets
