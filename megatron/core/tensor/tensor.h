// Tensor: shared storage + byte offset + dtype + contiguous row-major shape, on one device.
//
// A value type, cheap to copy (copies share storage). No autograd, no strides: views cut leading
// dimensions (slice/select) or reshape (view); anything else is a kernel. Activations are
// sequence-first [S, B, H] as in Megatron, so SP/CP shards along dim 0 are contiguous views.
// Storage is allocated by the device's platform allocator and freed when the last view dies.
// Pinned host tensors (empty_pinned) are host tensors whose storage comes from a platform's pinned
// host allocator: the staging buffers of host<->device copies (batch upload, checkpoint staging).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/device.h"
#include "megatron/core/tensor/dtype.h"

namespace mg {

namespace plugin {
class Allocator;
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(std::size_t nbytes, Device device);  // allocates through the device's platform
  // Host storage from `allocator` (a platform's pinned host allocator); pinned() reports it.
  Storage(std::size_t nbytes, plugin::Allocator& allocator, bool pinned);
  // Storage on `device` from `allocator` (a platform's sparse allocator).
  Storage(std::size_t nbytes, Device device, plugin::Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  bool pinned_ = false;
  std::size_t nbytes_ = 0;
  Device device_;
  plugin::Allocator* allocator_ = nullptr;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: !defined(); used for optional arguments

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Zeros from the sparse allocator of `device`'s platform (Platform::sparse_allocator: ranges
  // whose memory decommit can give back; host: the ordinary host allocator, whose pages can).
  static Tensor zeros_sparse(const Shape& shape, DType dtype, Device device);
  // Host tensor holding a copy of `values` converted to dtype.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
    return from_vector(values, shape, dtype_v<T>);
  }
  // Host tensor in the pinned host memory of the platform that owns `for_device` (page-locked
  // on CUDA; ordinary host memory for the CPU platform): the staging buffer of a copy to or from
  // that device. Its device() is the host. When the platform cannot pin more (its allocator
  // throws: cap reached, cudaHostAlloc failed) it is ordinary host memory and is_pinned() false.
  static Tensor empty_pinned(const Shape& shape, DType dtype, Device for_device);
  // Tensor on `device` holding `values` converted to dtype, staged through a pinned host buffer
  // when `device` is not the host (the per-step batch upload).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                            Device device);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  Device device() const { return device_; }
  bool is_host() const { return device_.is_host(); }
  bool is_pinned() const { return storage_ && storage_->pinned(); }  // from empty_pinned
  std::size_t offset_bytes() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  void* raw_data() const;
  template <typename T>
  T* data() const {
    MG_CHECK(dtype_v<T> == dtype_, "tensor has dtype " << dtype_name(dtype_) << ", accessed as "
                                                       << dtype_name(dtype_v<T>));
    return static_cast<T*>(raw_data());
  }

  // Same elements, new shape (one dimension may be -1). Shares storage.
  Tensor view(const Shape& shape) const;
  // Rows [start, start + length) of dim 0. Shares storage.
  Tensor slice(int64_t start, int64_t length) const;
  // Row i of dim 0, with dim 0 removed. Shares storage.
  Tensor select(int64_t i) const;

  // New tensor with converted elements (returns *this when nothing changes).
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  // Host copy in pinned memory of this tensor's platform (checkpoint staging; see empty_pinned);
  // a host tensor is returned as is.
  Tensor to_pinned_host() const;
  Tensor clone() const;
  // Copies src into this tensor: same numel; any dtype and device (converts, then moves).
  void copy_(const Tensor& src);
  void zero_();

  // Host copy of the elements converted to T (for tests and logging; any device).
  template <typename T>
  std::vector<T> to_vector() const;

  std::string str() const;  // "Tensor(f32, [2, 3], cpu)"

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // bytes from storage start
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t numel_ = 0;
  Device device_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- template implementations
// ---------------------------------------------------------------------
template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, DType dtype) {
  MG_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: " << values.size() << " values for shape " << shape_str(shape));
  Tensor t = empty(shape, dtype, Device::cpu());
  convert_host(t.raw_data(), dtype, values.data(), dtype_v<T>, values.size());
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                           Device device) {
  if (device.is_host()) return from_vector(values, shape, dtype);
  MG_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: " << values.size() << " values for shape " << shape_str(shape));
  Tensor h = empty_pinned(shape, dtype, device);
  convert_host(h.raw_data(), dtype, values.data(), dtype_v<T>, values.size());
  return h.to(device);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor h = to(Device::cpu());
  std::vector<T> out(static_cast<std::size_t>(numel_));
  convert_host(out.data(), dtype_v<T>, h.raw_data(), dtype_, out.size());
  return out;
}

}  // namespace mg
