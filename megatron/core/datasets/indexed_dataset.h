// Megatron's indexed dataset (`<prefix>.bin` / `<prefix>.idx`), byte-exact with
// megatron/core/datasets/indexed_dataset.py; the format is specified in /work/shared/FORMATS.md §1.
//
// .bin: the token ids of every sequence, concatenated, one element type, little-endian, no header.
// .idx: magic "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 N (sequences), u64 D+1 (length of
//       document_indices), then i32 lengths[N], i64 byte pointers[N], i64 document_indices[D+1],
//       unpadded (the arrays start at offset 34, so they are read with memcpy, never by casting).
// Invariants the reader checks: document_indices starts at 0, never decreases and ends at N;
// each sequence lies inside the .bin at an offset that is a multiple of the item size (so typed
// spans over the .bin mapping are aligned).
// Not done here: the multimodal `sequence_modes` array (the reader ignores trailing .idx bytes, as
// Megatron does without multimodal=True; the builder never writes it), the header-less "fast cache"
// read path, and big-endian hosts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "megatron/core/common/error.h"

namespace mg::datasets {

// Megatron's `DType` (indexed_dataset.py): the element type of the token ids in the .bin, with the
// numeric code stored in the .idx header (FORMATS.md §1.4). Separate from mg::DType, which has no
// int8/int16/uint16 and whose values are not a file format.
enum class IndexDType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

// The code written in the .idx header (Megatron's DType.code_from_dtype).
inline uint8_t index_dtype_code(IndexDType t) {
  return static_cast<uint8_t>(t);
}
// Megatron's DType.dtype_from_code; throws on a code outside 1..8.
IndexDType index_dtype_from_code(uint8_t code);
// Bytes per element (Megatron's DType.size).
std::size_t index_dtype_size(IndexDType t);
// numpy's name: "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16".
std::string_view index_dtype_name(IndexDType t);
// Megatron's DType.optimal_dtype, as tools/preprocess_data.py uses it: uint16 when
// vocab_size < 65500, otherwise int32.
IndexDType optimal_token_dtype(int64_t vocab_size);

// Megatron's get_idx_path / get_bin_path: "<prefix>.idx" / "<prefix>.bin".
std::string get_idx_path(const std::string& path_prefix);
std::string get_bin_path(const std::string& path_prefix);

namespace detail {
// A read-only mmap of a whole file; RAII for the descriptor and the mapping. An empty file maps to
// an empty span (mmap rejects length 0).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;
  std::string path_;
  int fd_ = -1;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};
}  // namespace detail

// Megatron's IndexedDataset: reads `<path_prefix>.idx` fully (the arrays are copied out, 12 bytes
// per sequence) and maps `<path_prefix>.bin` for the tokens. Every header field is validated on
// open; errors name the file and the field.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& path_prefix);

  const std::string& path_prefix() const { return path_prefix_; }
  IndexDType dtype() const { return dtype_; }
  // N, the number of sequences (Megatron's len(dataset)).
  std::size_t sequence_count() const { return sequence_lengths_.size(); }
  // The number of documents: length of document_indices minus one.
  std::size_t document_count() const { return document_indices_.size() - 1; }
  const std::vector<int32_t>& sequence_lengths() const { return sequence_lengths_; }
  // Byte offsets into the .bin.
  const std::vector<int64_t>& sequence_pointers() const { return sequence_pointers_; }
  // Document d is sequences [document_indices[d], document_indices[d+1]).
  const std::vector<int64_t>& document_indices() const { return document_indices_; }

  // Tokens [offset, offset + length) of sequence i, widened to int64 (Megatron's
  // get(idx, offset, length); length defaults to the rest of the sequence). Float dtypes must hold
  // integral values.
  std::vector<int64_t> get(std::size_t i, std::size_t offset = 0,
                           std::optional<std::size_t> length = std::nullopt) const;
  // The raw bytes of sequence i in the .bin mapping (valid while this object lives).
  std::span<const std::byte> get_bytes(std::size_t i) const;
  // Sequence i as a typed view over the .bin mapping, without copying. T must be the element type
  // of dtype() (uint16_t for uint16, int32_t for int32, ...). Aligned: the mapping is page-aligned
  // and every pointer is a multiple of the item size (checked on open).
  template <typename T>
  std::span<const T> get_span(std::size_t i) const;

  // Megatron's IndexedDataset.exists: both `<prefix>.idx` and `<prefix>.bin` exist.
  static bool exists(const std::string& path_prefix);

 private:
  void check_element_type(std::size_t elem_size, bool is_float, bool is_signed) const;

  std::string path_prefix_;
  IndexDType dtype_ = IndexDType::uint16;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> sequence_pointers_;
  std::vector<int64_t> document_indices_;
  detail::MappedFile bin_;
};

template <typename T>
std::span<const T> IndexedDataset::get_span(std::size_t i) const {
  check_element_type(sizeof(T), std::is_floating_point_v<T>, std::is_signed_v<T>);
  const std::span<const std::byte> b = get_bytes(i);
  return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
}

// Megatron's IndexedDatasetBuilder. The .bin is streamed to `<bin_path>.tmp`; finalize writes the
// .idx to `<idx_path>.tmp` and renames the .bin and then the .idx into place, so a final .idx
// exists only once both files are complete. A builder destroyed without finalize removes its
// temporaries. Token ids that do not fit the dtype are rejected (Megatron would wrap them silently
// via numpy).
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string bin_path, IndexDType dtype = IndexDType::int32);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Append one sequence (Megatron's add_item). It belongs to the document closed by the next
  // end_document().
  void add_item(std::span<const int64_t> tokens);
  void add_item(std::span<const int32_t> tokens);
  // Close the current document: it holds every sequence added since the previous one was closed.
  void end_document();
  // Append one whole document made of lengths.size() sequences (sentences) whose token counts are
  // `lengths`; they must sum to tokens.size().
  void add_document(std::span<const int64_t> tokens, std::span<const int64_t> lengths);
  // Append the dataset at `path_prefix` (Megatron's add_index, used to merge partitions): its
  // lengths, its document boundaries shifted by the current sequence count, and its .bin bytes.
  // The dtypes must match. As in Megatron, sequences added before it without end_document() become
  // part of the other dataset's first document.
  void add_index(const std::string& path_prefix);
  // Write the .idx and move both files into place. Every sequence must belong to a closed document
  // (the reader requires document_indices to end at N).
  void finalize(const std::string& idx_path);

  IndexDType dtype() const { return dtype_; }
  std::size_t sequence_count() const { return sequence_lengths_.size(); }

 private:
  template <typename T>
  void add_item_impl(std::span<const T> tokens);
  template <typename T>
  void write_tokens(std::span<const T> tokens);
  void check_open(const char* what) const;

  std::string bin_path_;
  std::string bin_tmp_path_;
  IndexDType dtype_;
  std::ofstream bin_;
  bool finalized_ = false;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_indices_{0};
  std::vector<std::byte> scratch_;
};

}  // namespace mg::datasets
