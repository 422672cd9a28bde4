// MegatronPretrainingSampler and the prefetching DataIterator (see data_samplers.h).
#include "megatron/core/datasets/data_samplers.h"

#include <algorithm>
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
  if (options_.cyclic) {
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
  if (start < total)
    sampler_ = std::make_unique<MegatronPretrainingSampler>(
        total, start, options_.micro_batch_size, options_.data_parallel_rank,
        options_.data_parallel_size, options_.drop_last);
  // sampler_ stays null when a single pass has nothing left: next() returns nullopt.
  if (options_.prefetch_depth > 0) worker_ = std::thread([this] { run(); });
}

DataIterator::~DataIterator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

DataIterator::Item DataIterator::produce() {
  Item item;
  try {
    std::optional<std::vector<int64_t>> idx;
    if (sampler_) idx = sampler_->next();
    if (!idx && options_.cyclic) {  // wrap around: a new pass from sample 0
      ++epoch_index_;
      sampler_ = std::make_unique<MegatronPretrainingSampler>(
          dataset_->size(), 0, options_.micro_batch_size, options_.data_parallel_rank,
          options_.data_parallel_size, options_.drop_last);
      idx = sampler_->next();
      MG_CHECK(idx.has_value(), "DataIterator: the cyclic pass yields no micro-batch for rank "
                                    << options_.data_parallel_rank);
    }
    if (!idx) return item;  // end of a single pass
    std::vector<GPTSample> samples;
    samples.reserve(idx->size());
    for (int64_t k : *idx) samples.push_back(dataset_->get(k));
    item.batch = collate(samples, std::move(*idx));
    item.consumed_after = epoch_index_ * epoch_samples_ + sampler_->consumed_samples();
  } catch (...) {
    item.error = std::current_exception();
  }
  return item;
}

void DataIterator::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return stop_ || static_cast<int>(queue_.size()) < options_.prefetch_depth;
      });
      if (stop_) return;
    }
    Item item = produce();
    const bool last = !item.batch.has_value();  // the end, or an error
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (last) return;
  }
}

std::optional<MicroBatch> DataIterator::next() {
  if (finished_) return std::nullopt;
  Item item;
  if (options_.prefetch_depth == 0) {
    item = produce();
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
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
