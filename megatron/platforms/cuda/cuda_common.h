// Host-side helpers shared by the CUDA kernel files: the thread's current stream, a device guard,
// stream-ordered scratch buffers, argument checks with uniform messages, and compute-type dispatch.
//
// Invariants: every op wrapper runs with the tensor's device current (DeviceGuard) and launches
// on current_stream(device); checks throw mg::Error naming the op, the argument and the value.
// Not here: device code (device_util.cuh), the Platform object (cuda_platform.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/validate.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/plugin/platform.h"

namespace mg::platforms::cuda {

inline constexpr const char* kPlatformName = "cuda";

// ---- provided by cuda_platform.cpp --------------------------------------------------------------
// The stream ops launch on for `device` on this thread (the platform's default stream unless
// set_current_stream() chose another).
cudaStream_t current_stream(int device);
// The caching device allocator of `device` (the one Platform::allocator returns).
plugin::Allocator& device_allocator(int device);
// Properties read once per device.
const cudaDeviceProp& device_properties(int device);

// Deferred checks of device-resident inputs, so that validating them costs no host round trip: a
// kernel that finds a bad value records it (record_deferred_error, device_util.cuh) in its
// device's record, mapped pinned host memory, the first error winning; the host throws it after
// the next stream synchronisation (Platform::copy's downloads, copy_to_host, synchronize), naming
// the op, the value and the row. The kernel itself must make the bad value harmless (no
// out-of-bounds access; its output may be NaN, which the error then explains).
struct DeferredError {
  int32_t state;  // 0 none, 1 being written, 2 recorded
  int32_t op;     // DeferredOp
  int64_t row, value, limit;
};
// kDeferredCuSeqlens: cu_seqlens entry `row` holds `value`, not a valid boundary of [0, S = limit]
// (cuDNN attention's ragged offsets, cudnn/cudnn_attention_kernels.cu).
enum DeferredOp : int32_t { kDeferredCrossEntropyTarget = 1, kDeferredCuSeqlens = 2 };
static_assert(sizeof(DeferredError) == 32 && offsetof(DeferredError, row) == 8,
              "device_util.cuh's record_deferred_error writes this layout");
// The record of `device`, as a device pointer.
DeferredError* deferred_error_record(int device);
// Throws the error recorded on `device` (and clears it), if any. Call after a synchronisation.
void raise_deferred_error(int device);

// Makes `device` current for the scope and restores the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

// A temporary device buffer from the caching allocator. Freeing is stream-ordered (the allocator
// records an event on the current stream), so it may go out of scope while kernels using it run.
class Scratch {
 public:
  Scratch() = default;
  Scratch(int device, std::size_t bytes)
      : device_(device), bytes_(bytes), ptr_(device_allocator(device).allocate(bytes)) {}
  ~Scratch() {
    if (ptr_) device_allocator(device_).deallocate(ptr_, bytes_);
  }
  Scratch(Scratch&& o) noexcept
      : device_(o.device_), bytes_(o.bytes_), ptr_(std::exchange(o.ptr_, nullptr)) {}
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  int device_ = 0;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// Synchronous copies between the host and `device` on the current stream (small metadata only:
// ids for the embedding backward, cu_seqlens).
void copy_to_host(void* dst, const void* src, std::size_t bytes, int device);
void copy_to_device(void* dst, const void* src, std::size_t bytes, int device);

// ---- launch geometry ------------------------------------------------------------------------
inline constexpr int kThreads = 256;  // threads per block of the element-wise and row kernels

// Blocks for a grid-stride loop over n elements (at least 1, capped: the loop covers the rest).
inline unsigned int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Grid of `rows` blocks (one block per row), as a 2-D grid when rows exceed the x limit.
inline dim3 grid_rows(int64_t rows) {
  constexpr int64_t kMaxX = 65535;
  if (rows <= kMaxX) return dim3(static_cast<unsigned int>(rows < 1 ? 1 : rows));
  return dim3(static_cast<unsigned int>(kMaxX),
              static_cast<unsigned int>((rows + kMaxX - 1) / kMaxX));
}

// ---- argument checks ----------------------------------------------------------------------------
// The op contracts are checked by megatron/core/ops/validate.h; placement is checked here.
using ops::check_same_dtype;
using ops::check_same_shape;
using ops::overlaps;

// Defined and on a CUDA device.
inline void check_cuda(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << name << " is undefined");
  MG_CHECK(t.device().type == DeviceType::cuda,
           op << ": " << name << " " << t.str() << " is not on a CUDA device");
}

inline void check_same_device(const char* op, const char* name, const Tensor& t,
                              const char* ref_name, const Tensor& ref) {
  MG_CHECK(t.device() == ref.device(), op << ": " << name << " is on " << t.device() << " but "
                                          << ref_name << " is on " << ref.device());
}

// The cuda platform's Placement for the ops::validate_* checks: every tensor of one call on a CUDA
// device, the device of the first tensor checked. One object per op call (it keeps that first).
class OnCudaDevice final : public ops::Placement {
 public:
  void check(const char* op, const char* name, const Tensor& t) const override {
    check_cuda(op, name, t);
    if (ref_name_.empty()) {
      ref_name_ = name;
      ref_ = t.device();
      return;
    }
    MG_CHECK(t.device() == ref_, op << ": " << name << " is on " << t.device() << " but "
                                    << ref_name_ << " is on " << ref_);
  }

 private:
  mutable std::string ref_name_;
  mutable Device ref_{};
};

// Calls f(C{}) with the compute type of dtype t: double for f64, float otherwise.
template <typename F>
decltype(auto) with_compute(DType t, F&& f) {
  if (t == DType::f64) return f(double{});
  return f(float{});
}

// Calls f(U{}) with U the unsigned integer type of t's element size (2, 4 or 8 bytes), for kernels
// that only move elements (fill, embedding gather) and so need one instantiation per width.
template <typename F>
void with_element_bits(DType t, const char* op, F&& f) {
  switch (dtype_size(t)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      MG_THROW(op << ": unsupported element size of " << dtype_name(t));
  }
}

}  // namespace mg::platforms::cuda
