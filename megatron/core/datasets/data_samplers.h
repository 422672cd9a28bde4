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
// MegatronPretrainingRandomSampler (--dataloader-type cyclic, Megatron's data_sharding=True form):
// epoch e = consumed / (total - total % (mbs*dp)); rank r's bucket is the samples
// [r*B, (r+1)*B), B = total / (mbs*dp) * mbs, visited in the order of torch.randperm(B) with a
// torch.Generator seeded with e (numpy-free: torch's mt19937 and its Fisher-Yates, see
// torch_randperm()); a restored position resumes mid-epoch. Endless (Megatron's cyclic_iter).
// --num-workers threads collate micro-batches ahead, in order, like a DataLoader's workers.
// Not done: context-parallel slicing (the model's job), the external dataloader type,
// --no-data-sharding's unsharded random order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::datasets {

// torch.randperm(n, generator=g) after g.manual_seed(seed) on the CPU: a permutation of [0, n)
// from torch's mt19937 (32-bit draws, `r % (n - i)` Fisher-Yates from the front). torch switches to
// 64-bit draws for n >= 2^32 / 20; such n is refused naming the limit.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

// Megatron's MegatronPretrainingRandomSampler with data_sharding (see the file comment); next()
// never ends.
class MegatronPretrainingRandomSampler {
 public:
  MegatronPretrainingRandomSampler(int64_t total_samples, int64_t consumed_samples,
                                   int64_t micro_batch_size, int64_t data_parallel_rank,
                                   int64_t data_parallel_size);
  std::vector<int64_t> next();
  int64_t consumed_samples() const { return consumed_; }

 private:
  void start_epoch();  // the permutation of the epoch consumed_ falls in, from its offset
  int64_t total_, consumed_, mbs_, rank_, dp_;
  std::vector<int64_t> order_;  // this epoch's remaining global sample indices for this rank
  std::size_t pos_ = 0;
};

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
  bool cyclic = false;  // wrap around forever instead of ending after one pass
  // Megatron's MegatronPretrainingRandomSampler (--dataloader-type cyclic): endless, reshuffled
  // per epoch; consumed_samples keeps counting across epochs. Implies cyclic.
  bool random = false;
  int prefetch_depth = 2;  // micro-batches collated ahead of next(); 0 = none (no thread)
  int num_workers = 1;     // threads collating ahead (with prefetch_depth > 0), results in order
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
  // The next micro-batch's indices from the sampler (under mu_ when there are workers); false at
  // the end of a single pass or on an error (then item.error is set).
  bool sample(Item& item, std::vector<int64_t>& idx);
  void fill(Item& item, std::vector<int64_t> idx);  // reads and collates the samples
  void run();                                       // a worker's loop

  std::shared_ptr<const MegatronDataset> dataset_;
  DataIteratorOptions options_;
  int64_t consumed_;
  int64_t epoch_samples_;    // samples one pass covers (full groups only with drop_last)
  int64_t epoch_index_ = 0;  // completed passes (cyclic)
  bool finished_ = false;    // next() has returned the end or an error
  std::unique_ptr<MegatronPretrainingSampler> sampler_;
  std::unique_ptr<MegatronPretrainingRandomSampler> random_sampler_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Item> ready_;  // collated items by sequence number
  int64_t next_seq_ = 0;           // the next sequence number a worker samples
  int64_t next_out_ = 0;           // the sequence number next() returns next
  bool sampling_done_ = false;     // the end (or an error) has its sequence number
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Collates samples (same S) into a MicroBatch; doc_ids only when every sample has them.
MicroBatch collate(const std::vector<GPTSample>& samples, std::vector<int64_t> sample_indices);

}  // namespace mg::datasets
