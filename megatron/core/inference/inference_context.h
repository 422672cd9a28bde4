// StaticInferenceContext: the KV cache of one generation (Megatron-Core's
// megatron/core/inference/contexts/static_context.py).
//
// One key and one value tensor per layer, [S_max, B, NG, HD] (this rank's query groups under TP)
// in the model's dtype on its device, allocated by the layer on first use. sequence_len_offset
// counts the tokens whose keys and values are already cached: GPTModel::infer runs the next Sq
// tokens at positions [offset, offset + Sq), appends their keys and values at those rows, lets
// them attend to rows [0, offset + Sq) (causal, bottom-right aligned) and then advances the
// offset. A prompt is one infer call over all its tokens (prefill), then one call per new token.
// Invariant: every layer's cache holds exactly sequence_len_offset valid rows between calls.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::inference {

class StaticInferenceContext {
 public:
  struct LayerCache {
    Tensor key, value;  // [S_max, B, NG, HD]; undefined until the layer's first infer
  };

  StaticInferenceContext(int64_t max_batch_size, int64_t max_sequence_length)
      : max_batch_size_(max_batch_size), max_sequence_length_(max_sequence_length) {
    MG_CHECK(max_batch_size >= 1 && max_sequence_length >= 1,
             "StaticInferenceContext: max_batch_size "
                 << max_batch_size << " and max_sequence_length " << max_sequence_length
                 << " must be >= 1");
  }

  int64_t max_batch_size() const { return max_batch_size_; }
  int64_t max_sequence_length() const { return max_sequence_length_; }
  // Tokens already in the cache (the position of the next one).
  int64_t sequence_len_offset = 0;

  // The cache of layer `layer` (grown to hold it; tensors undefined until first use).
  LayerCache& layer(int64_t layer) {
    if (static_cast<int64_t>(layers_.size()) <= layer)
      layers_.resize(static_cast<std::size_t>(layer + 1));
    return layers_[static_cast<std::size_t>(layer)];
  }
  // Forget the cached tokens (keeps the allocations).
  void reset() { sequence_len_offset = 0; }

 private:
  int64_t max_batch_size_;
  int64_t max_sequence_length_;
  std::vector<LayerCache> layers_;
};

}  // namespace mg::inference
