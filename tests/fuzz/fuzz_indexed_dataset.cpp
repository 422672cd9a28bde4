// libFuzzer target for the IndexedDataset reader (megatron/core/datasets/indexed_dataset.h): the
// input is split into a .idx and a .bin (the first 2 bytes give the .idx length), written to a
// scratch folder and opened; every sequence, document and typed view is then read back. A
// malformed pair must end in mg::Error, never in a crash, a sanitizer report, a hang or an
// allocation beyond the input's size. Built only with -DMG_FUZZ=ON and clang
// (tests/fuzz/README.md).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/indexed_dataset.h"

namespace {

const std::string& scratch_prefix() {
  static const std::string prefix = [] {
    const std::filesystem::path dir =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    return (dir / ("mg_fuzz_indexed_" + std::to_string(::getpid()))).string();
  }();
  return prefix;
}

void write(const std::string& path, const uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// Sums wrap (unsigned): the harness only needs every element read.
template <typename T>
uint64_t sum_span(const mg::datasets::IndexedDataset& ds, std::size_t i) {
  uint64_t s = 0;
  for (T v : ds.get_span<T>(i)) {
    uint64_t bits = 0;  // the bit pattern: a float may be NaN or out of int64 range
    std::memcpy(&bits, &v, sizeof(T));
    s += bits;
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t idx_len = std::min<std::size_t>(size - 2, data[0] | (data[1] << 8));
  const std::string& prefix = scratch_prefix();
  write(mg::datasets::get_idx_path(prefix), data + 2, idx_len);
  write(mg::datasets::get_bin_path(prefix), data + 2 + idx_len, size - 2 - idx_len);
  using mg::datasets::IndexDType;
  try {
    const mg::datasets::IndexedDataset ds(prefix);
    volatile uint64_t sink = 0;
    for (std::size_t i = 0; i < ds.sequence_count(); ++i) {
      for (int64_t v : ds.get(i)) sink = sink + static_cast<uint64_t>(v);
      const std::size_t len = static_cast<std::size_t>(ds.sequence_lengths()[i]);
      if (len > 1) sink = sink + ds.get(i, 1, len - 1).size();
      sink = sink + ds.get_bytes(i).size();
      switch (ds.dtype()) {
        case IndexDType::uint8:
          sink = sink + sum_span<uint8_t>(ds, i);
          break;
        case IndexDType::int8:
          sink = sink + sum_span<int8_t>(ds, i);
          break;
        case IndexDType::int16:
          sink = sink + sum_span<int16_t>(ds, i);
          break;
        case IndexDType::int32:
          sink = sink + sum_span<int32_t>(ds, i);
          break;
        case IndexDType::int64:
          sink = sink + sum_span<int64_t>(ds, i);
          break;
        case IndexDType::float64:
          sink = sink + sum_span<double>(ds, i);
          break;
        case IndexDType::float32:
          sink = sink + sum_span<float>(ds, i);
          break;
        case IndexDType::uint16:
          sink = sink + sum_span<uint16_t>(ds, i);
          break;
      }
    }
    for (std::size_t d = 0; d < ds.document_count(); ++d)
      sink = sink + static_cast<uint64_t>(ds.document_indices()[d + 1] - ds.document_indices()[d]);
    // Out-of-range requests must throw, not read.
    try {
      ds.get(ds.sequence_count());
      __builtin_trap();
    } catch (const mg::Error&) {
    }
  } catch (const mg::Error&) {
    // A clear error is the expected outcome for malformed input.
  }
  return 0;
}
