// Megatron's indexed dataset reader and builder (FORMATS.md §1). The .idx header is 34 bytes and
// unpadded, so every multi-byte field is read and written with memcpy; values are little-endian,
// which is the host order we require (static_assert below).
#include "megatron/core/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <system_error>

namespace mg::datasets {

static_assert(std::endian::native == std::endian::little,
              "the indexed dataset format is little-endian; big-endian hosts need byte swaps");

namespace {

constexpr std::array<unsigned char, 9> kMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
constexpr std::size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34: the arrays start here, unaligned

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void append(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// The inclusive range of integer token ids a dtype holds exactly. Floats hold every integer up to
// 2^mantissa_bits+1 exactly; beyond that ids would silently collide.
struct IdRange {
  int64_t lo, hi;
};
IdRange id_range(IndexDType t) {
  switch (t) {
    case IndexDType::uint8:
      return {0, 255};
    case IndexDType::int8:
      return {-128, 127};
    case IndexDType::int16:
      return {-32768, 32767};
    case IndexDType::int32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case IndexDType::int64:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
    case IndexDType::float64:
      return {-(int64_t{1} << 53), int64_t{1} << 53};
    case IndexDType::float32:
      return {-(int64_t{1} << 24), int64_t{1} << 24};
    case IndexDType::uint16:
      return {0, 65535};
  }
  MG_THROW("indexed dataset: unknown dtype " << int(index_dtype_code(t)));
}

template <typename T>
void put(std::byte* p, T x) {
  std::memcpy(p, &x, sizeof x);
}

// Stores v (already range-checked) at p as dtype t. p is byte-typed scratch, hence memcpy.
void store_token(std::byte* p, IndexDType t, int64_t v) {
  switch (t) {
    case IndexDType::uint8:
      return put(p, static_cast<uint8_t>(v));
    case IndexDType::int8:
      return put(p, static_cast<int8_t>(v));
    case IndexDType::int16:
      return put(p, static_cast<int16_t>(v));
    case IndexDType::int32:
      return put(p, static_cast<int32_t>(v));
    case IndexDType::int64:
      return put(p, v);
    case IndexDType::float64:
      return put(p, static_cast<double>(v));
    case IndexDType::float32:
      return put(p, static_cast<float>(v));
    case IndexDType::uint16:
      return put(p, static_cast<uint16_t>(v));
  }
}

int64_t float_token(double v, const std::string& file, std::size_t i) {
  MG_CHECK(std::isfinite(v) && v == std::trunc(v) && std::fabs(v) <= 9.0e18,
           "IndexedDataset " << file << ": sequence " << i << " holds " << v
                             << ", which is not an integer token id");
  return static_cast<int64_t>(v);
}

int64_t load_token(const std::byte* p, IndexDType t, const std::string& file, std::size_t i) {
  switch (t) {
    case IndexDType::uint8:
      return load<uint8_t>(p);
    case IndexDType::int8:
      return load<int8_t>(p);
    case IndexDType::int16:
      return load<int16_t>(p);
    case IndexDType::int32:
      return load<int32_t>(p);
    case IndexDType::int64:
      return load<int64_t>(p);
    case IndexDType::float64:
      return float_token(load<double>(p), file, i);
    case IndexDType::float32:
      return float_token(load<float>(p), file, i);
    case IndexDType::uint16:
      return load<uint16_t>(p);
  }
  MG_THROW("IndexedDataset " << file << ": unknown dtype " << int(index_dtype_code(t)));
}

std::string errno_text() {
  return std::system_category().message(errno);
}

}  // namespace

IndexDType index_dtype_from_code(uint8_t code) {
  MG_CHECK(code >= 1 && code <= 8,
           "indexed dataset: unknown dtype code " << int(code) << " (valid: 1..8)");
  return static_cast<IndexDType>(code);
}

std::size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::uint8:
    case IndexDType::int8:
      return 1;
    case IndexDType::int16:
    case IndexDType::uint16:
      return 2;
    case IndexDType::int32:
    case IndexDType::float32:
      return 4;
    case IndexDType::int64:
    case IndexDType::float64:
      return 8;
  }
  MG_THROW("indexed dataset: unknown dtype code " << int(index_dtype_code(t)));
}

std::string_view index_dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::uint8:
      return "uint8";
    case IndexDType::int8:
      return "int8";
    case IndexDType::int16:
      return "int16";
    case IndexDType::int32:
      return "int32";
    case IndexDType::int64:
      return "int64";
    case IndexDType::float64:
      return "float64";
    case IndexDType::float32:
      return "float32";
    case IndexDType::uint16:
      return "uint16";
  }
  MG_THROW("indexed dataset: unknown dtype code " << int(index_dtype_code(t)));
}

IndexDType optimal_token_dtype(int64_t vocab_size) {
  MG_CHECK(vocab_size > 0, "optimal_token_dtype: vocab_size " << vocab_size << " must be positive");
  return vocab_size < 65500 ? IndexDType::uint16 : IndexDType::int32;
}

std::string get_idx_path(const std::string& path_prefix) {
  return path_prefix + ".idx";
}
std::string get_bin_path(const std::string& path_prefix) {
  return path_prefix + ".bin";
}

// ---- MappedFile ---------------------------------------------------------------------------------

namespace detail {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_CHECK(fd_ >= 0, "cannot open " << path << ": " << errno_text());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string why = errno_text();
    release();
    MG_THROW("cannot stat " << path << ": " << why);
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text();
    release();
    MG_THROW("cannot mmap " << path << " (" << st.st_size << " bytes): " << why);
  }
  data_ = p;
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), data_(other.data_), size_(other.size_) {
  other.fd_ = -1;
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    data_ = other.data_;
    size_ = other.size_;
    other.fd_ = -1;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

}  // namespace detail

// ---- IndexedDataset -----------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& path_prefix)
    : path_prefix_(path_prefix), bin_(get_bin_path(path_prefix)) {
  const std::string idx_path = get_idx_path(path_prefix);
  const detail::MappedFile idx(idx_path);
  const std::span<const std::byte> b = idx.bytes();
  const std::size_t size = b.size();

  MG_CHECK(size >= kHeaderSize, "IndexedDataset " << idx_path << ": truncated header: the file has "
                                                  << size << " bytes, the header needs "
                                                  << kHeaderSize);
  MG_CHECK(std::memcmp(b.data(), kMagic.data(), kMagic.size()) == 0,
           "IndexedDataset " << idx_path
                             << ": bad magic (expected \"MMIDIDX\\0\\0\"): not an indexed dataset "
                                "index, or written by another tool");
  const auto version = load<uint64_t>(b.data() + 9);
  MG_CHECK(version == kVersion, "IndexedDataset " << idx_path << ": version " << version
                                                  << " is not supported (expected 1)");
  const auto code = load<uint8_t>(b.data() + 17);
  MG_CHECK(code >= 1 && code <= 8, "IndexedDataset " << idx_path << ": dtype code " << int(code)
                                                     << " is unknown (valid: 1..8)");
  dtype_ = static_cast<IndexDType>(code);
  const auto n = load<uint64_t>(b.data() + 18);
  const auto doc_len = load<uint64_t>(b.data() + 26);
  MG_CHECK(doc_len >= 1, "IndexedDataset " << idx_path
                                           << ": document_count (length of document_indices) is 0; "
                                              "it is at least 1");
  // Check the counts against the file size before multiplying, so huge values cannot overflow.
  const std::size_t avail = size - kHeaderSize;
  MG_CHECK(n <= avail / 12 && doc_len <= (avail - 12 * n) / 8,
           "IndexedDataset " << idx_path << ": sequence_count " << n << " and document_count "
                             << doc_len << " need " << kHeaderSize << " + 12*" << n << " + 8*"
                             << doc_len << " bytes, but the file has " << size
                             << " (truncated or corrupt)");

  sequence_lengths_.resize(n);
  sequence_pointers_.resize(n);
  document_indices_.resize(doc_len);
  const std::byte* p = b.data() + kHeaderSize;
  if (n > 0) {
    std::memcpy(sequence_lengths_.data(), p, 4 * n);
    std::memcpy(sequence_pointers_.data(), p + 4 * n, 8 * n);
  }
  std::memcpy(document_indices_.data(), p + 12 * n, 8 * doc_len);

  MG_CHECK(document_indices_[0] == 0, "IndexedDataset " << idx_path << ": document_indices[0] is "
                                                        << document_indices_[0] << ", expected 0");
  for (std::size_t d = 1; d < doc_len; ++d) {
    MG_CHECK(document_indices_[d] >= document_indices_[d - 1],
             "IndexedDataset " << idx_path << ": document_indices[" << d
                               << "] = " << document_indices_[d] << " is below document_indices["
                               << d - 1 << "] = " << document_indices_[d - 1]);
  }
  MG_CHECK(document_indices_.back() == static_cast<int64_t>(n),
           "IndexedDataset " << idx_path << ": the last document_indices entry is "
                             << document_indices_.back() << ", expected sequence_count " << n);

  const auto item = static_cast<int64_t>(index_dtype_size(dtype_));
  const auto bin_size = static_cast<int64_t>(bin_.bytes().size());
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t len = sequence_lengths_[i];
    const int64_t ptr = sequence_pointers_[i];
    MG_CHECK(len >= 0, "IndexedDataset " << idx_path << ": sequence_lengths[" << i << "] = " << len
                                         << " is negative");
    MG_CHECK(ptr >= 0 && ptr % item == 0 && ptr <= bin_size && len <= (bin_size - ptr) / item,
             "IndexedDataset " << idx_path << ": sequence " << i << " (sequence_pointers = " << ptr
                               << " bytes, sequence_lengths = " << len << " x " << item
                               << " bytes) does not lie aligned inside " << bin_.path() << " ("
                               << bin_size << " bytes)");
  }
  // The pair must agree: the sequences tile the .bin densely from byte 0 (every writer, Megatron's
  // included, writes it so) and their lengths x item size add up to its size. This refuses a dtype
  // byte changed, an altered length, another corpus's .idx and a .bin/.idx pair from two runs.
  int64_t expect = 0;
  for (std::size_t i = 0; i < n; ++i) {
    MG_CHECK(sequence_pointers_[i] == expect,
             "IndexedDataset " << idx_path << ": sequence " << i << " starts at byte "
                               << sequence_pointers_[i] << " of " << bin_.path() << ", but the "
                               << "earlier sequences' lengths x " << item << " bytes ("
                               << index_dtype_name(dtype_) << ") end at byte " << expect
                               << ": the .idx does not describe this .bin (a corrupt dtype or "
                                  "length, or the index of another corpus)");
    expect += static_cast<int64_t>(sequence_lengths_[i]) * item;
  }
  MG_CHECK(expect == bin_size,
           "IndexedDataset " << idx_path << ": its " << n << " sequences hold " << expect / item
                             << " tokens x " << item << " bytes (" << index_dtype_name(dtype_)
                             << ") = " << expect << " bytes, but " << bin_.path() << " has "
                             << bin_size
                             << " bytes: the .idx and .bin disagree (a corrupt or mismatched "
                                "pair, e.g. a replacement interrupted between the two files)");
}

bool IndexedDataset::exists(const std::string& path_prefix) {
  std::error_code ec;
  return std::filesystem::is_regular_file(get_idx_path(path_prefix), ec) &&
         std::filesystem::is_regular_file(get_bin_path(path_prefix), ec);
}

std::span<const std::byte> IndexedDataset::get_bytes(std::size_t i) const {
  MG_CHECK(i < sequence_count(), "IndexedDataset " << path_prefix_ << ": sequence " << i
                                                   << " is out of range (" << sequence_count()
                                                   << " sequences)");
  const std::size_t nbytes =
      static_cast<std::size_t>(sequence_lengths_[i]) * index_dtype_size(dtype_);
  if (nbytes == 0) return {};
  return bin_.bytes().subspan(static_cast<std::size_t>(sequence_pointers_[i]), nbytes);
}

std::vector<int64_t> IndexedDataset::get(std::size_t i, std::size_t offset,
                                         std::optional<std::size_t> length) const {
  const std::span<const std::byte> bytes = get_bytes(i);
  const std::size_t item = index_dtype_size(dtype_);
  const std::size_t total = bytes.size() / item;
  MG_CHECK(offset <= total, "IndexedDataset " << path_prefix_ << ": offset " << offset
                                              << " is past the end of sequence " << i << " (length "
                                              << total << ")");
  const std::size_t len = length.value_or(total - offset);
  MG_CHECK(len <= total - offset, "IndexedDataset " << path_prefix_ << ": offset " << offset
                                                    << " + length " << len << " exceeds sequence "
                                                    << i << " (length " << total << ")");
  std::vector<int64_t> out(len);
  for (std::size_t k = 0; k < len; ++k) {
    out[k] = load_token(bytes.data() + (offset + k) * item, dtype_, path_prefix_, i);
  }
  return out;
}

void IndexedDataset::check_element_type(std::size_t elem_size, bool is_float,
                                        bool is_signed) const {
  const bool want_float = dtype_ == IndexDType::float32 || dtype_ == IndexDType::float64;
  const bool want_signed = dtype_ != IndexDType::uint8 && dtype_ != IndexDType::uint16;
  MG_CHECK(
      elem_size == index_dtype_size(dtype_) && is_float == want_float && is_signed == want_signed,
      "IndexedDataset " << path_prefix_ << ": get_span<T> with a " << elem_size << "-byte "
                        << (is_float ? "float" : (is_signed ? "signed" : "unsigned"))
                        << " T, but the dataset's dtype is " << index_dtype_name(dtype_));
}

// ---- IndexedDatasetBuilder ----------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string bin_path, IndexDType dtype)
    : bin_path_(std::move(bin_path)), bin_tmp_path_(bin_path_ + ".tmp"), dtype_(dtype) {
  index_dtype_size(dtype_);  // rejects an enum value outside the code table
  bin_.open(bin_tmp_path_, std::ios::binary | std::ios::trunc);
  MG_CHECK(bin_.is_open(),
           "IndexedDatasetBuilder: cannot create " << bin_tmp_path_ << ": " << errno_text());
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) {
    // Abandoned (an exception, or finalize never called): leave nothing that looks like output.
    bin_.close();
    std::error_code ec;
    std::filesystem::remove(bin_tmp_path_, ec);
  }
}

void IndexedDatasetBuilder::check_open(const char* what) const {
  MG_CHECK(!finalized_,
           "IndexedDatasetBuilder " << bin_path_ << ": " << what << " after finalize()");
}

template <typename T>
void IndexedDatasetBuilder::write_tokens(std::span<const T> tokens) {
  const IdRange r = id_range(dtype_);
  const std::size_t item = index_dtype_size(dtype_);
  scratch_.resize(tokens.size() * item);
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    const auto v = static_cast<int64_t>(tokens[k]);
    MG_CHECK(v >= r.lo && v <= r.hi, "IndexedDatasetBuilder "
                                         << bin_path_ << ": token id " << v << " (position " << k
                                         << ") does not fit dtype " << index_dtype_name(dtype_)
                                         << " [" << r.lo << ", " << r.hi << "]");
    store_token(scratch_.data() + k * item, dtype_, v);
  }
  bin_.write(reinterpret_cast<const char*>(scratch_.data()),
             static_cast<std::streamsize>(scratch_.size()));
  MG_CHECK(bin_.good(), "IndexedDatasetBuilder: write to " << bin_tmp_path_ << " failed");
}

template <typename T>
void IndexedDatasetBuilder::add_item_impl(std::span<const T> tokens) {
  check_open("add_item");
  MG_CHECK(tokens.size() <= static_cast<std::size_t>(std::numeric_limits<int32_t>::max()),
           "IndexedDatasetBuilder " << bin_path_ << ": a sequence of " << tokens.size()
                                    << " tokens does not fit the int32 sequence_lengths field");
  write_tokens(tokens);
  sequence_lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::add_item(std::span<const int64_t> tokens) {
  add_item_impl(tokens);
}
void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  add_item_impl(tokens);
}

void IndexedDatasetBuilder::end_document() {
  check_open("end_document");
  document_indices_.push_back(static_cast<int64_t>(sequence_lengths_.size()));
}

void IndexedDatasetBuilder::add_document(std::span<const int64_t> tokens,
                                         std::span<const int64_t> lengths) {
  check_open("add_document");
  int64_t sum = 0;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    MG_CHECK(lengths[s] >= 0 && lengths[s] <= std::numeric_limits<int32_t>::max(),
             "IndexedDatasetBuilder " << bin_path_ << ": add_document lengths[" << s
                                      << "] = " << lengths[s] << " is not a valid int32 length");
    sum += lengths[s];
  }
  MG_CHECK(sum == static_cast<int64_t>(tokens.size()),
           "IndexedDatasetBuilder " << bin_path_ << ": add_document lengths sum to " << sum
                                    << " but " << tokens.size() << " tokens were given");
  write_tokens(tokens);
  for (const int64_t len : lengths) sequence_lengths_.push_back(static_cast<int32_t>(len));
  document_indices_.push_back(static_cast<int64_t>(sequence_lengths_.size()));
}

void IndexedDatasetBuilder::add_index(const std::string& path_prefix) {
  check_open("add_index");
  const IndexedDataset other(path_prefix);
  MG_CHECK(other.dtype() == dtype_, "IndexedDatasetBuilder "
                                        << bin_path_ << ": add_index(" << path_prefix
                                        << ") has dtype " << index_dtype_name(other.dtype())
                                        << ", this builder writes " << index_dtype_name(dtype_));
  const auto offset = static_cast<int64_t>(sequence_lengths_.size());
  sequence_lengths_.insert(sequence_lengths_.end(), other.sequence_lengths().begin(),
                           other.sequence_lengths().end());
  for (std::size_t d = 1; d < other.document_indices().size(); ++d) {
    document_indices_.push_back(offset + other.document_indices()[d]);
  }
  // Byte copy of the other .bin, as Megatron does (shutil.copyfileobj).
  std::ifstream in(get_bin_path(path_prefix), std::ios::binary);
  MG_CHECK(in.is_open(), "IndexedDatasetBuilder: cannot open " << get_bin_path(path_prefix) << ": "
                                                               << errno_text());
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) bin_.write(buf.data(), got);
  }
  MG_CHECK(in.eof() && bin_.good(), "IndexedDatasetBuilder: copying " << get_bin_path(path_prefix)
                                                                      << " into " << bin_tmp_path_
                                                                      << " failed");
}

void IndexedDatasetBuilder::finalize(const std::string& idx_path) {
  check_open("finalize");
  const auto n = static_cast<int64_t>(sequence_lengths_.size());
  MG_CHECK(document_indices_.back() == n,
           "IndexedDatasetBuilder " << bin_path_ << ": finalize with "
                                    << n - document_indices_.back()
                                    << " sequence(s) not closed by end_document(); the reader "
                                       "requires every sequence to belong to a document");
  bin_.close();
  MG_CHECK(!bin_.fail(), "IndexedDatasetBuilder: closing " << bin_tmp_path_ << " failed");

  std::string out;
  out.reserve(kHeaderSize + 12 * sequence_lengths_.size() + 8 * document_indices_.size());
  out.append(reinterpret_cast<const char*>(kMagic.data()), kMagic.size());
  append(out, kVersion);
  append(out, index_dtype_code(dtype_));
  append(out, static_cast<uint64_t>(n));
  append(out, static_cast<uint64_t>(document_indices_.size()));
  for (const int32_t len : sequence_lengths_) append(out, len);
  // Pointers are recomputed from the lengths, so they are always dense (as Megatron's finalize).
  const auto item = static_cast<int64_t>(index_dtype_size(dtype_));
  int64_t ptr = 0;
  for (const int32_t len : sequence_lengths_) {
    append(out, ptr);
    ptr += static_cast<int64_t>(len) * item;
  }
  for (const int64_t d : document_indices_) append(out, d);

  const std::string idx_tmp_path = idx_path + ".tmp";
  {
    std::ofstream idx(idx_tmp_path, std::ios::binary | std::ios::trunc);
    MG_CHECK(idx.is_open(),
             "IndexedDatasetBuilder: cannot create " << idx_tmp_path << ": " << errno_text());
    idx.write(out.data(), static_cast<std::streamsize>(out.size()));
    idx.close();
    if (idx.fail()) {
      std::error_code ignored;
      std::filesystem::remove(idx_tmp_path, ignored);
      MG_THROW("IndexedDatasetBuilder: writing " << idx_tmp_path << " failed");
    }
  }
  // Replacing a pair: the old .idx goes first, then the .bin is renamed, the .idx last. A final
  // .idx then implies the complete .bin of the same run beside it; an interruption leaves a .bin
  // without .idx (an error naming it), never a new .bin under an old .idx (and readers check that
  // the two agree).
  std::error_code ec;
  std::filesystem::remove(idx_path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(idx_tmp_path, ignored);
  }
  MG_CHECK(!ec,
           "IndexedDatasetBuilder: removing the old " << idx_path << " failed: " << ec.message());
  std::filesystem::rename(bin_tmp_path_, bin_path_, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(idx_tmp_path, ignored);
  }
  MG_CHECK(!ec, "IndexedDatasetBuilder: renaming " << bin_tmp_path_ << " to " << bin_path_
                                                   << " failed: " << ec.message());
  std::filesystem::rename(idx_tmp_path, idx_path, ec);
  MG_CHECK(!ec, "IndexedDatasetBuilder: renaming " << idx_tmp_path << " to " << idx_path
                                                   << " failed: " << ec.message());
  finalized_ = true;
}

}  // namespace mg::datasets
