// safetensors reader (strict, over a Storage mapping) and writer (reference layout, one atomic
// Storage object). See safetensors.h; no file I/O here, only the Storage interface.
#include "megatron/core/dist_checkpointing/safetensors.h"

#include <xxhash.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace mg::dist_checkpointing {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeader = 100000000;

struct DtypeInfo {
  const char* name;
  int bits;
};
// The safetensors Dtype enum in its declaration order (the writer's "alignment" order).
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
    {"I64", 64},        {"U64", 64}};

int dtype_rank(const std::string& s) {
  for (std::size_t i = 0; i < std::size(kDtypes); ++i)
    if (s == kDtypes[i].name) return static_cast<int>(i);
  return -1;
}

}  // namespace

std::string safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "F64";
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::fp8_e4m3:
      return "F8_E4M3";
    case DType::fp8_e5m2:
      return "F8_E5M2";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  MG_THROW("safetensors_dtype: unknown dtype " << static_cast<int>(dtype));
}

DType dtype_from_safetensors(const std::string& s) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2,
                  DType::i32, DType::i64, DType::u8})
    if (safetensors_dtype(d) == s) return d;
  MG_THROW("safetensors dtype '" << s
                                 << "' has no Megatron-CPP dtype (supported: F64, F32, BF16, F16, "
                                    "F8_E4M3, F8_E5M2, I32, I64, U8)");
}

std::string checksum_hex(std::span<const std::byte> bytes) {
  const XXH64_hash_t h = XXH3_64bits(bytes.data(), bytes.size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

SafetensorsFile::SafetensorsFile(const std::string& path, bool verify_checksums)
    : SafetensorsFile(*storage_for(path), path, verify_checksums) {}

SafetensorsFile::SafetensorsFile(const Storage& storage, const std::string& path,
                                 bool verify_checksums)
    : path_(path), verify_(verify_checksums) {
  MG_CHECK(storage.exists(path),
           "cannot open safetensors file '" << path << "': it does not exist");
  map_ = storage.map(path);
  const std::size_t file_size = map_->bytes().size();
  MG_CHECK(file_size >= 8, "safetensors file '" << path << "' is truncated: " << file_size
                                                << " bytes, fewer than the 8-byte header length");
  {
    const auto* base = reinterpret_cast<const unsigned char*>(map_->bytes().data());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
    MG_CHECK(n <= kMaxHeader, "safetensors file '" << path << "': header too large (" << n
                                                   << " bytes, limit " << kMaxHeader << ")");
    MG_CHECK(8 + n <= file_size, "safetensors file '" << path << "' is truncated: header of " << n
                                                      << " bytes but the file has " << file_size);
    std::string header(reinterpret_cast<const char*>(base + 8), n);
    MG_CHECK(!header.empty() && header[0] == '{',
             "safetensors file '" << path << "': header does not start with '{'");
    data_start_ = 8 + n;

    // Duplicate keys are an error (nlohmann keeps the last): track the keys of each open object.
    std::vector<std::set<std::string>> open_keys;
    std::string duplicate;
    auto cb = [&](int, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::object_start) open_keys.emplace_back();
      if (ev == json::parse_event_t::object_end) open_keys.pop_back();
      if (ev == json::parse_event_t::key && !open_keys.empty() &&
          !open_keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    };
    json h;
    try {
      h = json::parse(header, cb);  // validates UTF-8; trailing spaces are whitespace
    } catch (const json::exception& e) {
      MG_THROW("safetensors file '" << path << "': header is not valid JSON: " << e.what());
    }
    MG_CHECK(duplicate.empty(),
             "safetensors file '" << path << "': duplicate key '" << duplicate << "' in header");
    MG_CHECK(h.is_object(), "safetensors file '" << path << "': header is not a JSON object");

    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        MG_CHECK(v.is_object(), "safetensors file '" << path << "': __metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          MG_CHECK(m.value().is_string(), "safetensors file '" << path << "': __metadata__['"
                                                               << m.key() << "'] is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string where = "safetensors file '" + path + "', tensor '" + name + "'";
      MG_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") &&
                   v.contains("data_offsets") && v.size() == 3,
               where << ": entry must have exactly dtype, shape and data_offsets");
      MG_CHECK(v["dtype"].is_string(), where << ": dtype is not a string");
      SafetensorsEntry e;
      e.name = name;
      e.dtype = v["dtype"].get<std::string>();
      const int rank = dtype_rank(e.dtype);
      MG_CHECK(rank >= 0, where << ": unknown dtype '" << e.dtype << "'");
      MG_CHECK(v["shape"].is_array(), where << ": shape is not an array");
      uint64_t numel = 1;
      for (const json& d : v["shape"]) {
        MG_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 where << ": shape entries must be non-negative integers");
        const uint64_t dim = d.get<uint64_t>();
        MG_CHECK(dim == 0 || numel <= UINT64_MAX / 64 / dim, where << ": shape overflows");
        numel *= dim;
        e.shape.push_back(static_cast<int64_t>(dim));
      }
      const json& off = v["data_offsets"];
      MG_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               where << ": data_offsets must be two non-negative integers");
      e.begin = off[0].get<std::size_t>();
      e.end = off[1].get<std::size_t>();
      MG_CHECK(e.begin <= e.end,
               where << ": data_offsets [" << e.begin << ", " << e.end << "] are reversed");
      const uint64_t bits = numel * static_cast<uint64_t>(kDtypes[rank].bits);
      MG_CHECK(bits % 8 == 0, where << ": " << numel << " elements of " << e.dtype
                                    << " are not a whole number of bytes");
      MG_CHECK(e.end - e.begin == bits / 8, where << ": data_offsets span " << e.end - e.begin
                                                  << " bytes but shape " << shape_str(e.shape)
                                                  << " of " << e.dtype << " needs " << bits / 8);
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::size_t expect = 0;
    for (const auto& e : entries_) {
      MG_CHECK(e.begin == expect, "safetensors file '" << path << "': tensor '" << e.name
                                                       << "' begins at byte " << e.begin
                                                       << " of the data buffer, expected " << expect
                                                       << " (hole or overlap)");
      expect = e.end;
    }
    MG_CHECK(data_start_ + expect == file_size,
             "safetensors file '" << path << "' "
                                  << (data_start_ + expect > file_size ? "is truncated"
                                                                       : "has trailing bytes")
                                  << ": header promises " << data_start_ + expect
                                  << " bytes, the file has " << file_size);
    for (std::size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  }
  if (auto it = metadata_.find(kChecksumMetadataKey); it != metadata_.end()) {
    json sums;
    try {
      sums = json::parse(it->second);
    } catch (const json::exception& e) {
      MG_THROW("safetensors file '" << path << "': __metadata__['" << kChecksumMetadataKey
                                    << "'] is not JSON (" << e.what() << "): corrupt checkpoint");
    }
    MG_CHECK(sums.is_object(), "safetensors file '" << path << "': __metadata__['"
                                                    << kChecksumMetadataKey
                                                    << "'] is not an object: corrupt checkpoint");
    for (auto s = sums.begin(); s != sums.end(); ++s) {
      MG_CHECK(s.value().is_string() && index_.count(s.key()),
               "safetensors file '" << path << "': checksum entry '" << s.key()
                                    << "' names no tensor of the file: corrupt checkpoint");
      checksums_[s.key()] = s.value().get<std::string>();
    }
  }
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  MG_CHECK(it != index_.end(), "safetensors file '" << path_ << "' has no tensor '" << name << "'");
  return entries_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const auto& e = entry(name);
  const auto b = map_->bytes().subspan(data_start_ + e.begin, e.end - e.begin);
  if (verify_ && !checksums_.empty()) {
    std::lock_guard<std::mutex> lock(verified_mutex_);
    if (!verified_.count(name)) {
      const auto it = checksums_.find(name);
      MG_CHECK(it != checksums_.end(), "safetensors file '" << path_ << "': tensor '" << name
                                                            << "' has no checksum although the "
                                                               "file's other tensors have one "
                                                               "(corrupt checkpoint)");
      const std::string got = checksum_hex(b);
      MG_CHECK(got == it->second, "checkpoint file '"
                                      << path_ << "': tensor '" << name
                                      << "' fails its checksum (stored XXH3-64 " << it->second
                                      << ", the bytes hash to " << got
                                      << "): the file is corrupt; restore it or load an "
                                         "earlier checkpoint");
      verified_.insert(name);
    }
  }
  return b;
}

void SafetensorsFile::prefetch(const std::string& name) const {
  const auto& e = entry(name);
  map_->prefetch(data_start_ + e.begin, e.end - e.begin);
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto& e = entry(name);
  Tensor t = Tensor::empty(e.shape, dtype_from_safetensors(e.dtype));
  auto b = bytes(name);
  if (!b.empty()) std::memcpy(t.raw_data(), b.data(), b.size());
  return t;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, bool checksums) {
  save_safetensors(*storage_for(path), path, tensors, metadata, checksums);
}

void save_safetensors(Storage& storage, const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& given_metadata, bool checksums) {
  std::vector<std::pair<std::string, Tensor>> order;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    MG_CHECK(name != "__metadata__", "save_safetensors: '__metadata__' is not a tensor name");
    MG_CHECK(seen.insert(name).second, "save_safetensors: tensor '" << name << "' given twice");
    MG_CHECK(t.defined(), "save_safetensors: tensor '" << name << "' is undefined");
    order.emplace_back(name, t.to_pinned_host());  // device tensors via pinned staging
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    const int ra = dtype_rank(safetensors_dtype(a.second.dtype()));
    const int rb = dtype_rank(safetensors_dtype(b.second.dtype()));
    return ra != rb ? ra > rb : a.first < b.first;
  });
  std::map<std::string, std::string> metadata = given_metadata;
  if (checksums) {
    MG_CHECK(!metadata.count(kChecksumMetadataKey),
             "save_safetensors: metadata key '" << kChecksumMetadataKey << "' is reserved");
    nlohmann::ordered_json sums = nlohmann::ordered_json::object();
    for (const auto& [name, t] : order)
      sums[name] = checksum_hex(
          std::span<const std::byte>(static_cast<const std::byte*>(t.raw_data()), t.nbytes()));
    metadata[kChecksumMetadataKey] = sums.dump();
  }
  // Compact JSON, __metadata__ first, then the tensors in layout order (ordered_json keeps order).
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::size_t offset = 0;
  for (const auto& [name, t] : order) {
    nlohmann::ordered_json e;
    e["dtype"] = safetensors_dtype(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    h[name] = e;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  std::vector<std::span<const std::byte>> buffers = {
      std::as_bytes(std::span<const unsigned char>(len, 8)),
      std::as_bytes(std::span<const char>(header.data(), header.size()))};
  for (const auto& [name, t] : order)
    buffers.emplace_back(static_cast<const std::byte*>(t.raw_data()), t.nbytes());
  storage.write_object(path, buffers);
}

}  // namespace mg::dist_checkpointing
