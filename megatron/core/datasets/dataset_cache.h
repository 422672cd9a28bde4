// --data-cache-path files as Megatron-Core writes them (FORMATS.md §3.10): the description text
// (Python's json.dumps(OrderedDict, indent=4)), its MD5, "<md5>-<Class>-<split>-<affix>" names,
// and NumPy 1.0 .npy arrays; plus the lock that lets several ranks start together.
//
// Invariants: py_json_dumps reproduces json.dumps(indent=4) byte for byte for the values it models
// (null, bool, int, float with Python's repr, ASCII-escaped strings, lists, ordered dicts), so the
// MD5s, and hence the cache file names, equal Megatron's. A cache entry is complete iff its
// description file exists: the builder writes every .npy and then the description, each to a
// temporary name renamed into place, all under an exclusive flock on "<base>.lock", so a reader
// never sees a missing or half-written file.
// Not done: reading pickled (object) arrays, Fortran order, big-endian hosts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "megatron/core/tokenizers/build_tokenizer.h"

namespace mg::datasets {

// A JSON value with Python's json module's output rules. Objects keep insertion order.
class PyJson {
 public:
  using Object = std::vector<std::pair<std::string, PyJson>>;
  using Array = std::vector<PyJson>;

  PyJson() = default;  // null
  explicit PyJson(bool b) : v_(b) {}
  explicit PyJson(int64_t i) : v_(i) {}
  explicit PyJson(int i) : v_(static_cast<int64_t>(i)) {}
  explicit PyJson(double d) : v_(d) {}
  explicit PyJson(std::string s) : v_(std::move(s)) {}
  explicit PyJson(const char* s) : v_(std::string(s)) {}
  static PyJson array(Array items);
  static PyJson object(Object items);

  bool is_null() const { return std::holds_alternative<std::monostate>(v_); }
  // json.dumps(value, indent=indent) (separators ", " / ": " as Python uses with indent).
  std::string dumps(int indent = 4) const;

 private:
  void dump(std::string& out, int indent, int depth) const;
  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> v_;
};

// Python's repr(float): shortest round-trip digits, "1.0", "0.99", "1e-05", "1e+16", "inf".
std::string python_float_repr(double d);

// Megatron's MegatronLegacyTokenizer.unique_identifiers: {"class": class_name,
// "tokenizer_path": [paths...] (null entries for std::nullopt), then each option as str(value)}.
PyJson legacy_tokenizer_identifiers(
    const std::string& class_name, const std::vector<std::optional<std::string>>& paths,
    const std::vector<std::pair<std::string, std::string>>& options = {});

// The tokenizer identity Megatron-LM records in every dataset description for these tokenizer
// flags (so caches are shared both ways):
//   default system (megatron.core.tokenizers, build_tokenizer): {"class":
//     "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",
//     "tokenizer_path": <GPT2BPETokenizer | --tokenizer-model | null for NullTokenizer>, then the
//     keyword arguments it passes, each as str(value), in its order};
//   --legacy-tokenizer (megatron/training/tokenizer): {"class": "_GPT2BPETokenizer" | ...,
//     "tokenizer_path": [the files], then the options} (legacy_tokenizer_identifiers).
// Flags Megatron-LM has and this build does not (--tokenizer-special-tokens,
// --tokenizer-hf-no-use-fast, --trust-remote-code, --vocab-extra-ids, ...) take their defaults.
PyJson megatron_tokenizer_identifiers(const tokenizers::TokenizerArgs& args);

// MD5 (RFC 1321) of bytes, as 32 lowercase hex digits.
std::string md5_hex(std::string_view bytes);

// ---- .npy (NumPy format 1.0) -----------------------------------------------------------------

// One array: element type as NumPy's descr ("<i2", "<i4", "<i8", "<u4"), C-order shape, raw
// little-endian bytes.
struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
  int64_t numel() const;
  // Elements widened to int64 (the descr must be an integer type).
  std::vector<int64_t> to_int64() const;
};

// numpy.save's bytes: magic, version 1.0, the header dict padded with spaces and '\n' to a
// multiple of 64 bytes, then the data.
std::string npy_bytes(const NpyArray& array);
NpyArray make_npy(std::string descr, std::vector<int64_t> shape,
                  const std::vector<int64_t>& values);
// Reads and validates a .npy file (magic, version 1.x/2.x, header dict, descr, fortran_order False,
// data length); errors name the file and the field.
NpyArray read_npy(const std::string& path);

// ---- cache entries ---------------------------------------------------------------------------

// "<dir>/<md5(description)>-<class_name>-<split>": the files are "<base>-description.txt" and
// "<base>-<name>.npy"; the lock is "<base>.lock".
std::string cache_base_path(const std::string& dir, const std::string& description,
                            std::string_view class_name, std::string_view split);

// Loads the cache entry at `base` (arrays "<base>-<name>.npy" for each of `names`), or, on a miss,
// takes the exclusive flock on "<base>.lock" (creating the directory as needed), checks again,
// and otherwise calls build() and writes each array and then the description, each to a
// temporary name renamed into place. Returns the arrays in the order of `names`, from the cache
// or from build(). A hit is Megatron's rule: the description and every array file exist.
// Errors (an unwritable directory, a corrupt .npy) name the path.
std::vector<NpyArray> load_or_build_cached(const std::string& base, const std::string& description,
                                           const std::vector<std::string>& names,
                                           const std::function<std::vector<NpyArray>()>& build);

}  // namespace mg::datasets
