// Tensor and Storage. Device memory and cross-device movement go through the platform that owns the
// device (global registry); host memory through the host allocator, which needs no platform.
#include "megatron/core/tensor/tensor.h"

#include <cstring>
#include <sstream>

#include "megatron/core/common/host_sync.h"
#include "megatron/plugin/registry.h"

namespace mg {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    MG_CHECK(d >= 0, "negative dimension in shape " << shape_str(s));
    n *= d;
  }
  return n;
}

namespace {
plugin::Platform& platform_of(Device d) {
  return plugin::global_registry().platform(d.type);
}
}  // namespace

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ =
      device.is_host() ? &plugin::host_allocator() : &platform_of(device).allocator(device.index);
  data_ = allocator_->allocate(nbytes);
}

Storage::Storage(std::size_t nbytes, plugin::Allocator& allocator, bool pinned)
    : pinned_(pinned), nbytes_(nbytes), device_(Device::cpu()), allocator_(&allocator) {
  data_ = allocator_->allocate(nbytes);
}

Storage::Storage(std::size_t nbytes, Device device, plugin::Allocator& allocator)
    : nbytes_(nbytes), device_(device), allocator_(&allocator) {
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() {
  allocator_->deallocate(data_, nbytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype, Device for_device) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = Device::cpu();
  if (!for_device.is_host()) {
    try {
      t.storage_ = std::make_shared<Storage>(t.nbytes(),
                                             platform_of(for_device).pinned_host_allocator(), true);
      return t;
    } catch (const Error&) {  // no more page-locked memory: pageable staging still works
    }
  }
  t.storage_ = std::make_shared<Storage>(t.nbytes(), plugin::host_allocator(), false);
  return t;
}

Tensor Tensor::zeros_sparse(const Shape& shape, DType dtype, Device device) {
  if (device.is_host()) return zeros(shape, dtype, device);
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device,
                                         platform_of(device).sparse_allocator(device.index));
  t.zero_();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  MG_CHECK(i >= 0 && i < n, "dimension " << d << " out of range for shape " << shape_str(shape_));
  return shape_[i];
}

void* Tensor::raw_data() const {
  MG_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  MG_CHECK(defined(), "view of an undefined tensor");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MG_CHECK(infer < 0, "view: more than one -1 in " << shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      MG_CHECK(s[i] >= 0, "view: invalid dimension in " << shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MG_CHECK(known > 0 && numel_ % known == 0,
             "view: cannot infer -1 in " << shape_str(shape) << " from " << numel_ << " elements");
    s[infer] = numel_ / known;
  }
  MG_CHECK(shape_numel(s) == numel_, "view: shape " << shape_str(shape) << " has " << shape_numel(s)
                                                    << " elements, tensor " << shape_str(shape_)
                                                    << " has " << numel_);
  Tensor t = *this;
  t.shape_ = std::move(s);
  return t;
}

Tensor Tensor::slice(int64_t start, int64_t length) const {
  MG_CHECK(dim() >= 1, "slice of a 0-d tensor");
  MG_CHECK(start >= 0 && length >= 0 && start + length <= shape_[0],
           "slice [" << start << ", " << start + length << ") out of range for dim 0 of "
                     << shape_str(shape_));
  Tensor t = *this;
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.offset_ += static_cast<std::size_t>(start * row) * dtype_size(dtype_);
  t.shape_[0] = length;
  t.numel_ = row * length;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  Tensor t = slice(i, 1);
  t.shape_.erase(t.shape_.begin());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to_pinned_host() const {
  MG_CHECK(defined(), "to_pinned_host of an undefined tensor");
  if (device_.is_host()) return *this;
  Tensor out = empty_pinned(shape_, dtype_, device_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  MG_CHECK(defined() && src.defined(), "copy_ with an undefined tensor");
  MG_CHECK(src.numel_ == numel_,
           "copy_: source " << src.str() << " into " << str() << ": element counts differ");
  if (numel_ == 0) return;
  if (src.dtype_ == dtype_) {
    if (device_.is_host() && src.device_.is_host()) {
      std::memmove(raw_data(), src.raw_data(), nbytes());
    } else {
      plugin::Platform& p = platform_of(device_.is_host() ? src.device_ : device_);
      MG_CHECK(device_.is_host() || src.device_.is_host() || device_.type == src.device_.type,
               "copy_ between " << src.device_ << " and " << device_ << " needs a host hop");
      if (device_.is_host() && !src.device_.is_host() && !detail::in_counted_host_read())
        count_host_sync(HostSync::other);  // a device-to-host copy outside host_read
      p.copy(raw_data(), device_, src.raw_data(), src.device_, nbytes());
    }
    return;
  }
  if (src.device_ == device_) {  // convert in place on the device
    if (device_.is_host())
      convert_host(raw_data(), dtype_, src.raw_data(), src.dtype_, numel_);
    else
      platform_of(device_).convert(raw_data(), dtype_, src.raw_data(), src.dtype_, numel_,
                                   device_.index);
    return;
  }
  // Different dtype and device: convert where the source lives, then move.
  Tensor tmp = src.to(dtype_);
  copy_(tmp);
}

void Tensor::zero_() {
  if (numel_ == 0) return;
  if (device_.is_host())
    std::memset(raw_data(), 0, nbytes());
  else
    platform_of(device_).memset_zero(raw_data(), device_.index, nbytes());
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype_name(dtype_) << ", " << shape_str(shape_) << ", " << device_.str()
     << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.str();
}

}  // namespace mg
