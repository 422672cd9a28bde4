// MegatronPretrainingSampler and the prefetching DataIterator (see data_samplers.h).
#include "megatron/core/datasets/data_samplers.h"

#include <algorithm>
#include <limits>
#include <random>
#include <utility>

#include "megatron/core/common/error.h"

namespace mg::datasets {

MegatronPretrainingSampler::MegatronPretrainingSampler(int64_t total_samples,
                                                       int64_t consumed_samples,
                                                       int64_t micro_batch_size,
                                                       int64_t data_parallel_rank,
                                                       int64_t data_parallel_size, bool drop_last)
    : total_(total_samples),
      consumed_(consumed_samples),
      mbs_(micro_batch_size),
      rank_(data_parallel_rank),
      dp_(data_parallel_size),
      drop_last_(drop_last) {
  // Megatron's asserts, as errors that show the values.
  MG_CHECK(total_ > 0,
           "MegatronPretrainingSampler: no sample to consume (total_samples " << total_ << ")");
  MG_CHECK(consumed_ >= 0 && consumed_ < total_, "MegatronPretrainingSampler: consumed_samples "
                                                     << consumed_ << " must be in [0, " << total_
                                                     << ")");
  MG_CHECK(mbs_ > 0, "MegatronPretrainingSampler: micro_batch_size must be > 0, got " << mbs_);
  MG_CHECK(dp_ > 0, "MegatronPretrainingSampler: data_parallel_size must be > 0, got " << dp_);
  MG_CHECK(rank_ >= 0 && rank_ < dp_, "MegatronPretrainingSampler: data_parallel_rank "
                                          << rank_ << " must be in [0, " << dp_ << ")");
}

std::optional<std::vector<int64_t>> MegatronPretrainingSampler::next() {
  const int64_t group = mbs_ * dp_;
  if (consumed_ >= total_) return std::nullopt;
  if (drop_last_ && consumed_ + group > total_) return std::nullopt;
  const int64_t begin = std::min(consumed_ + rank_ * mbs_, total_);
  const int64_t end = std::min(begin + mbs_, total_);
  consumed_ = std::min(consumed_ + group, total_);
  if (begin == end) return std::nullopt;  // a final partial group too short to reach this rank
  std::vector<int64_t> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  MG_CHECK(n >= 0, "torch_randperm: n must be >= 0, got " << n);
  // torch's randperm_cpu keeps 32-bit draws (r % (n - i)) only below this bound.
  constexpr int64_t kLimit = static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20);
  MG_CHECK(n < kLimit, "torch_randperm: n " << n << " needs torch's 64-bit-draw permutation "
                                            << "(n >= " << kLimit << "), not implemented");
  // torch.Generator.manual_seed(seed): mt19937 initialised with the low 32 bits of the seed.
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::vector<int64_t> r(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(gen() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<std::size_t>(i)], r[static_cast<std::size_t>(z + i)]);
  }
  return r;
}

MegatronPretrainingRandomSampler::MegatronPretrainingRandomSampler(int64_t total_samples,
                                                                   int64_t consumed_samples,
                                                                   int64_t micro_batch_size,
                                                                   int64_t data_parallel_rank,
                                                                   int64_t data_parallel_size)
    : total_(total_samples),
      consumed_(consumed_samples),
      mbs_(micro_batch_size),
      rank_(data_parallel_rank),
      dp_(data_parallel_size) {
  MG_CHECK(total_ > 0, "MegatronPretrainingRandomSampler: no sample to consume (total_samples "
                           << total_ << ")");
  MG_CHECK(mbs_ > 0,
           "MegatronPretrainingRandomSampler: micro_batch_size must be > 0, got " << mbs_);
  MG_CHECK(dp_ > 0,
           "MegatronPretrainingRandomSampler: data_parallel_size must be > 0, got " << dp_);
  MG_CHECK(rank_ >= 0 && rank_ < dp_, "MegatronPretrainingRandomSampler: data_parallel_rank "
                                          << rank_ << " must be in [0, " << dp_ << ")");
  MG_CHECK(consumed_ >= 0,
           "MegatronPretrainingRandomSampler: consumed_samples must be >= 0, got " << consumed_);
  MG_CHECK(total_ >= mbs_ * dp_, "MegatronPretrainingRandomSampler: "
                                     << total_ << " samples are fewer than one micro-batch on "
                                     << "every rank (micro_batch_size " << mbs_
                                     << " x data_parallel_size " << dp_ << ")");
  start_epoch();
}

void MegatronPretrainingRandomSampler::start_epoch() {
  const int64_t group = mbs_ * dp_;
  const int64_t active_total = total_ - total_ % group;
  const int64_t epoch = consumed_ / active_total;
  const int64_t epoch_consumed = consumed_ % active_total;
  MG_CHECK(epoch_consumed % group == 0,
           "MegatronPretrainingRandomSampler: consumed_samples "
               << consumed_ << " is not at a micro-batch boundary (multiples of " << group << ")");
  const int64_t bucket_size = total_ / group * mbs_;
  const int64_t bucket_offset = epoch_consumed / dp_;
  const int64_t start = rank_ * bucket_size;
  const std::vector<int64_t> perm = torch_randperm(bucket_size, static_cast<uint64_t>(epoch));
  order_.clear();
  for (int64_t k = bucket_offset; k < bucket_size; ++k)
    order_.push_back(start + perm[static_cast<std::size_t>(k)]);
  pos_ = 0;
}

std::vector<int64_t> MegatronPretrainingRandomSampler::next() {
  // Megatron drops an incomplete last batch; an epoch's bucket holds whole micro-batches.
  if (pos_ + static_cast<std::size_t>(mbs_) > order_.size()) start_epoch();
  std::vector<int64_t> out(order_.begin() + static_cast<std::ptrdiff_t>(pos_),
                           order_.begin() + static_cast<std::ptrdiff_t>(pos_) + mbs_);
  pos_ += static_cast<std::size_t>(mbs_);
  consumed_ += mbs_ * dp_;
  return out;
}

void DataIteratorOptions::validate() const {
  MG_CHECK(micro_batch_size > 0,
           "DataIterator: micro_batch_size must be > 0, got " << micro_batch_size);
  MG_CHECK(data_parallel_size > 0,
           "DataIterator: data_parallel_size must be > 0, got " << data_parallel_size);
  MG_CHECK(data_parallel_rank >= 0 && data_parallel_rank < data_parallel_size,
           "DataIterator: data_parallel_rank " << data_parallel_rank << " must be in [0, "
                                               << data_parallel_size << ")");
  MG_CHECK(consumed_samples >= 0,
           "DataIterator: consumed_samples must be >= 0, got " << consumed_samples);
  MG_CHECK(prefetch_depth >= 0,
           "DataIterator: prefetch_depth must be >= 0, got " << prefetch_depth);
  MG_CHECK(num_workers >= 0, "DataIterator: num_workers must be >= 0, got " << num_workers);
}

MicroBatch collate(const std::vector<GPTSample>& samples, std::vector<int64_t> sample_indices) {
  MG_CHECK(!samples.empty(), "collate: no samples");
  MG_CHECK(samples.size() == sample_indices.size(),
           "collate: " << samples.size() << " samples but " << sample_indices.size() << " indices");
  const std::size_t S = samples[0].tokens.size();
  const int64_t B = static_cast<int64_t>(samples.size());
  bool with_doc_ids = true;
  std::vector<int64_t> tokens, labels, position_ids;
  std::vector<float> loss_mask;
  std::vector<int32_t> doc_ids;
  for (std::size_t b = 0; b < samples.size(); ++b) {
    const GPTSample& s = samples[b];
    MG_CHECK(s.tokens.size() == S && s.labels.size() == S && s.loss_mask.size() == S &&
                 s.position_ids.size() == S,
             "collate: sample " << sample_indices[b] << " has " << s.tokens.size()
                                << " tokens, the micro-batch has S = " << S);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    loss_mask.insert(loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
    position_ids.insert(position_ids.end(), s.position_ids.begin(), s.position_ids.end());
    with_doc_ids = with_doc_ids && s.doc_ids.size() == S;
    if (with_doc_ids) doc_ids.insert(doc_ids.end(), s.doc_ids.begin(), s.doc_ids.end());
  }
  const Shape shape{B, static_cast<int64_t>(S)};
  MicroBatch mb;
  mb.tokens = Tensor::from_vector(tokens, shape, DType::i64);
  mb.labels = Tensor::from_vector(labels, shape, DType::i64);
  mb.loss_mask = Tensor::from_vector(loss_mask, shape, DType::f32);
  mb.position_ids = Tensor::from_vector(position_ids, shape, DType::i64);
  if (with_doc_ids) mb.doc_ids = Tensor::from_vector(doc_ids, shape, DType::i32);
  mb.sample_indices = std::move(sample_indices);
  return mb;
}

DataIterator::DataIterator(std::shared_ptr<const MegatronDataset> dataset,
                           DataIteratorOptions options)
    : dataset_(std::move(dataset)), options_(options), consumed_(options.consumed_samples) {
  MG_CHECK(dataset_ != nullptr, "DataIterator: the dataset is null (is that split absent?)");
  options_.validate();
  const int64_t total = dataset_->size();
  const int64_t group = options_.micro_batch_size * options_.data_parallel_size;
  epoch_samples_ = options_.drop_last ? total / group * group : total;
  int64_t start = consumed_;
  if (options_.random) {
    random_sampler_ = std::make_unique<MegatronPretrainingRandomSampler>(
        total, consumed_, options_.micro_batch_size, options_.data_parallel_rank,
        options_.data_parallel_size);
  } else if (options_.cyclic) {
    MG_CHECK(epoch_samples_ > 0, "DataIterator: a cyclic pass over "
                                     << total << " samples yields no micro-batch "
                                     << "(micro_batch_size " << options_.micro_batch_size
                                     << " x data_parallel_size " << options_.data_parallel_size
                                     << " with drop_last)");
    epoch_index_ = consumed_ / epoch_samples_;
    start = consumed_ % epoch_samples_;
  } else {
    MG_CHECK(consumed_ <= total, "DataIterator: consumed_samples "
                                     << consumed_ << " is beyond the dataset's " << total
                                     << " samples");
  }
  if (!random_sampler_ && start < total)
    sampler_ = std::make_unique<MegatronPretrainingSampler>(
        total, start, options_.micro_batch_size, options_.data_parallel_rank,
        options_.data_parallel_size, options_.drop_last);
  // sampler_ stays null when a single pass has nothing left: next() returns nullopt.
  if (options_.prefetch_depth > 0) {
    const int n = std::max(1, options_.num_workers);
    for (int w = 0; w < n; ++w) workers_.emplace_back([this] { run(); });
  }
}

DataIterator::~DataIterator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

bool DataIterator::sample(Item& item, std::vector<int64_t>& idx) {
  try {
    if (random_sampler_) {
      idx = random_sampler_->next();
      item.consumed_after = random_sampler_->consumed_samples();
      return true;
    }
    std::optional<std::vector<int64_t>> next;
    if (sampler_) next = sampler_->next();
    if (!next && options_.cyclic) {  // wrap around: a new pass from sample 0
      ++epoch_index_;
      sampler_ = std::make_unique<MegatronPretrainingSampler>(
          dataset_->size(), 0, options_.micro_batch_size, options_.data_parallel_rank,
          options_.data_parallel_size, options_.drop_last);
      next = sampler_->next();
      MG_CHECK(next.has_value(), "DataIterator: the cyclic pass yields no micro-batch for rank "
                                     << options_.data_parallel_rank);
    }
    if (!next) return false;  // end of a single pass
    idx = std::move(*next);
    item.consumed_after = epoch_index_ * epoch_samples_ + sampler_->consumed_samples();
    return true;
  } catch (...) {
    item.error = std::current_exception();
    return false;
  }
}

void DataIterator::fill(Item& item, std::vector<int64_t> idx) {
  try {
    std::vector<GPTSample> samples;
    samples.reserve(idx.size());
    for (int64_t k : idx) samples.push_back(dataset_->get(k));
    item.batch = collate(samples, std::move(idx));
  } catch (...) {
    item.error = std::current_exception();
  }
}

// A worker: takes the next sequence number and its indices under the lock (the samplers are
// sequential), reads and collates outside it, and files the item by number, so next() returns
// micro-batches in sampler order whichever worker finished first.
void DataIterator::run() {
  for (;;) {
    Item item;
    std::vector<int64_t> idx;
    int64_t seq = 0;
    bool have = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return stop_ || sampling_done_ || next_seq_ < next_out_ + options_.prefetch_depth;
      });
      if (stop_ || sampling_done_) return;
      seq = next_seq_++;
      have = sample(item, idx);
      if (!have) sampling_done_ = true;
    }
    if (have) fill(item, std::move(idx));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace(seq, std::move(item));
    }
    cv_.notify_all();
  }
}

std::optional<MicroBatch> DataIterator::next() {
  if (finished_) return std::nullopt;
  Item item;
  if (workers_.empty()) {
    std::vector<int64_t> idx;
    if (sample(item, idx)) fill(item, std::move(idx));
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return ready_.count(next_out_) != 0; });
    auto it = ready_.find(next_out_);
    item = std::move(it->second);
    ready_.erase(it);
    ++next_out_;
    lock.unlock();
    cv_.notify_all();
  }
  if (item.error) {
    finished_ = true;
    std::rethrow_exception(item.error);
  }
  if (!item.batch) {
    finished_ = true;
    return std::nullopt;
  }
  consumed_ = item.consumed_after;
  return std::move(item.batch);
}

}  // namespace mg::datasets
