// How samples reach a data-parallel rank (FORMATS.md §3.14): Megatron's MegatronPretrainingSampler
// (megatron/training/datasets/data_samplers.py) and a DataIterator that collates the rank's
// micro-batches into host Tensors on a background thread.
//
// Invariants: global sample indices run upward from consumed_samples in groups of
// micro_batch_size * data_parallel_size; rank r takes positions [r*mbs, (r+1)*mbs) of each group.
// consumed_samples() counts samples of all DP ranks (Megatron's args.consumed_train_samples unit),
// advances by mbs*dp per micro-batch handed out (not per micro-batch prefetched), and a
// DataIterator constructed with that value continues with exactly the next micro-batch.
// Cyclic mode wraps to sample 0 after the last (full, with drop_last) group; consumed_samples()
// then keeps counting (a restored value is reduced modulo the epoch length).
// Not done: MegatronPretrainingRandomSampler (--dataloader-type cyclic's per-epoch reshuffle),
// context-parallel slicing (the model's job), the external dataloader type.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::datasets {

class MegatronPretrainingSampler {
 public:
  // total_samples > 0, 0 <= consumed_samples < total_samples, micro_batch_size > 0,
  // 0 <= data_parallel_rank < data_parallel_size.
  MegatronPretrainingSampler(int64_t total_samples, int64_t consumed_samples,
                             int64_t micro_batch_size, int64_t data_parallel_rank,
                             int64_t data_parallel_size, bool drop_last = true);

  // This rank's next micro-batch of global sample indices; nullopt once the samples run out.
  // Without drop_last the final partial group is split by the same [r*mbs, (r+1)*mbs) rule, so a
  // rank may get fewer than mbs indices, or none (then nullopt).
  std::optional<std::vector<int64_t>> next();
  // Samples of all ranks consumed so far (starts at the constructor's consumed_samples).
  int64_t consumed_samples() const { return consumed_; }

 private:
  int64_t total_, consumed_, mbs_, rank_, dp_;
  bool drop_last_;
};

// One micro-batch for this rank. B = the number of samples (mbs, or fewer in a final partial
// batch).
struct MicroBatch {
  Tensor tokens;        // [B, S] i64
  Tensor labels;        // [B, S] i64
  Tensor loss_mask;     // [B, S] f32
  Tensor position_ids;  // [B, S] i64
  Tensor doc_ids;       // [B, S] i32, only with reset_attention_mask (AttentionArgs::doc_ids)
  std::vector<int64_t> sample_indices;  // [B] the global sample indices
};

struct DataIteratorOptions {
  int64_t micro_batch_size = 1;
  int64_t data_parallel_rank = 0;
  int64_t data_parallel_size = 1;
  int64_t consumed_samples = 0;  // where to start (a checkpoint's value)
  bool drop_last = true;
  bool cyclic = false;     // wrap around forever instead of ending after one pass
  int prefetch_depth = 2;  // micro-batches collated ahead on the background thread; 0 = none
  void validate() const;
};

// Collates micro-batches for one DP rank. next() is called from one thread; a background thread
// (when prefetch_depth > 0) runs ahead. Errors from the dataset are rethrown by next().
class DataIterator {
 public:
  DataIterator(std::shared_ptr<const MegatronDataset> dataset, DataIteratorOptions options);
  ~DataIterator();  // stops and joins the background thread
  DataIterator(const DataIterator&) = delete;
  DataIterator& operator=(const DataIterator&) = delete;

  // The next micro-batch, or nullopt at the end of a single pass.
  std::optional<MicroBatch> next();
  // The position to save in a checkpoint: samples (all DP ranks) consumed by the micro-batches
  // next() has returned.
  int64_t consumed_samples() const { return consumed_; }

 private:
  struct Item {
    std::optional<MicroBatch> batch;  // nullopt: end
    int64_t consumed_after = 0;
    std::exception_ptr error;
  };
  Item produce();  // the next item from the sampler (on whichever thread)
  void run();      // the background loop

  std::shared_ptr<const MegatronDataset> dataset_;
  DataIteratorOptions options_;
  int64_t consumed_;
  int64_t epoch_samples_;    // samples one pass covers (full groups only with drop_last)
  int64_t epoch_index_ = 0;  // completed passes (cyclic)
  bool finished_ = false;    // next() has returned the end or an error
  std::unique_ptr<MegatronPretrainingSampler> sampler_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  bool producer_done_ = false;
  std::thread worker_;
};

// Collates samples (same S) into a MicroBatch; doc_ids only when every sample has them.
MicroBatch collate(const std::vector<GPTSample>& samples, std::vector<int64_t> sample_indices);

}  // namespace mg::datasets
