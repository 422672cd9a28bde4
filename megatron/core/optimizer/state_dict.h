// StateDict: the named tensors and scalars an optimizer, grad scaler or LR scheduler hands to a
// checkpoint and takes back on resume. Plain data; the checkpoint code decides the file format
// (tensors to safetensors, numbers and strings to JSON).
//
// Invariants: numbers are doubles; integer counters (steps, trackers) are exact below 2^53, so a
// round trip through JSON must print 17 significant digits. Tensors returned by a state_dict() may
// be views of live optimizer state: write or clone them before the next step. Lookups of a missing
// key throw naming the key and the keys present.
#pragma once

#include <map>
#include <string>

#include "megatron/core/tensor/tensor.h"

namespace mg::optimizer {

struct StateDict {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;

  bool has_tensor(const std::string& key) const { return tensors.count(key) != 0; }
  bool has_number(const std::string& key) const { return numbers.count(key) != 0; }
  bool has_string(const std::string& key) const { return strings.count(key) != 0; }
  const Tensor& tensor(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& string(const std::string& key) const;

  // Adds every entry of `other` with `prefix` prepended to its key (e.g. "grad_scaler.").
  void merge(const std::string& prefix, const StateDict& other);
  // The entries whose key starts with `prefix`, with the prefix removed.
  StateDict sub(const std::string& prefix) const;
  bool empty() const { return tensors.empty() && numbers.empty() && strings.empty(); }
};

}  // namespace mg::optimizer
