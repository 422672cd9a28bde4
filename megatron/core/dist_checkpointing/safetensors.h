// safetensors files (FORMATS.md §7): a strict, mmap-backed reader and an atomic writer.
//
// Reader invariants (checked on open, each failure an mg::Error naming the file and the problem):
// header length N <= 100,000,000 and 8 + N <= file size; the header is UTF-8 JSON starting with
// '{' (trailing spaces allowed); no duplicate keys; "__metadata__" maps strings to strings; every
// tensor's data_offsets are contiguous from 0 without holes or overlaps, END - BEGIN equals
// numel * bits / 8, and the last END + 8 + N equals the file size (so a truncated file or one with
// trailing bytes is refused). The mapping lives as long as the SafetensorsFile.
// Writer: the reference layout (tensors sorted by descending dtype alignment, then name; compact
// JSON with __metadata__ first; header space-padded to a multiple of 8), written as one object of
// a Storage (storage.h: durable and atomic, so a reader never sees a partial file under the final
// name). All file I/O goes through a Storage; the overloads without one use storage_for(path).
// Checksums (Megatron-CPP's checkpoints): with `checksums` the writer stores an XXH3-64 of every
// tensor's bytes in __metadata__[kChecksumMetadataKey] (a JSON object name -> 16 hex digits); a
// reader that verifies (the default) hashes a tensor's bytes on its first bytes()/tensor() and
// throws naming the file and the tensor on a mismatch. Files without the key (HF, older
// checkpoints) are read as before.
// Not done: the sharded model.safetensors.index.json (§7.6), big-endian hosts, F4/F6 packing on
// read into Tensors (such entries validate but cannot be turned into a Tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/dist_checkpointing/storage.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::dist_checkpointing {

// One tensor entry of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the safetensors dtype string, e.g. "BF16"
  Shape shape;
  std::size_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  std::size_t end = 0;
};

// "F32" etc. for an mg::DType (every mg::DType has one).
std::string safetensors_dtype(DType dtype);
// The mg::DType of a safetensors dtype string; throws for strings without one (e.g. "I16").
DType dtype_from_safetensors(const std::string& dtype);

inline constexpr const char* kChecksumMetadataKey = "mg_checksums_xxh3_64";

// XXH3-64 of `bytes` (libxxhash), as 16 lower-case hex digits.
std::string checksum_hex(std::span<const std::byte> bytes);

class SafetensorsFile {
 public:
  // Opens, maps and validates; verify_checksums: check each tensor against its stored checksum.
  explicit SafetensorsFile(const std::string& path, bool verify_checksums = true);
  SafetensorsFile(const Storage& storage, const std::string& path, bool verify_checksums = true);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor names in data order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // The raw little-endian bytes of a tensor, inside the mapping (checksum-verified once).
  std::span<const std::byte> bytes(const std::string& name) const;
  // Whether the file carries per-tensor checksums.
  bool has_checksums() const { return !checksums_.empty(); }
  // Asks the kernel to read the tensor's pages ahead (madvise WILLNEED; a hint, errors ignored):
  // one large read-ahead instead of a page fault per 4 KiB when copying out of the mapping.
  void prefetch(const std::string& name) const;
  // A host tensor holding a copy of the named tensor.
  Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedObject> map_;
  std::size_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;  // sorted by begin
  std::map<std::string, std::size_t> index_;
  bool verify_ = true;
  std::map<std::string, std::string> checksums_;  // name -> hex, from the metadata
  mutable std::mutex verified_mutex_;
  mutable std::set<std::string> verified_;
};

// Writes `tensors` (any devices; copied to the host through pinned staging memory) to `path`
// atomically. Names must be unique and must not be "__metadata__". checksums: add the per-tensor
// XXH3-64 checksums to the metadata.
void save_safetensors(Storage& storage, const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      bool checksums = false);
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      bool checksums = false);

}  // namespace mg::dist_checkpointing
