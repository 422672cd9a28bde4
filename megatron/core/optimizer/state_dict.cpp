// StateDict lookups with errors that name the missing key and list what is there.
#include "megatron/core/optimizer/state_dict.h"

#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::optimizer {

namespace {

template <typename Map>
std::string keys_of(const Map& m) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const auto& [k, v] : m) {
    os << (first ? "" : ", ") << k;
    first = false;
  }
  os << "]";
  return os.str();
}

template <typename Map>
const typename Map::mapped_type& lookup(const Map& m, const std::string& key, const char* what) {
  auto it = m.find(key);
  MG_CHECK(it != m.end(),
           "state dict has no " << what << " '" << key << "'; " << what << "s: " << keys_of(m));
  return it->second;
}

template <typename Map>
void merge_into(Map& dst, const std::string& prefix, const Map& src) {
  for (const auto& [k, v] : src) dst[prefix + k] = v;
}

template <typename Map>
void sub_into(Map& dst, const std::string& prefix, const Map& src) {
  for (const auto& [k, v] : src)
    if (k.size() >= prefix.size() && k.compare(0, prefix.size(), prefix) == 0)
      dst[k.substr(prefix.size())] = v;
}

}  // namespace

const Tensor& StateDict::tensor(const std::string& key) const {
  return lookup(tensors, key, "tensor");
}
double StateDict::number(const std::string& key) const {
  return lookup(numbers, key, "number");
}
const std::string& StateDict::string(const std::string& key) const {
  return lookup(strings, key, "string");
}

void StateDict::merge(const std::string& prefix, const StateDict& other) {
  merge_into(tensors, prefix, other.tensors);
  merge_into(numbers, prefix, other.numbers);
  merge_into(strings, prefix, other.strings);
}

StateDict StateDict::sub(const std::string& prefix) const {
  StateDict out;
  sub_into(out.tensors, prefix, tensors);
  sub_into(out.numbers, prefix, numbers);
  sub_into(out.strings, prefix, strings);
  return out;
}

}  // namespace mg::optimizer
