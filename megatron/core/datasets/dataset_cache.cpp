// Cache files of the dataset indices (see dataset_cache.h): Python-compatible JSON, MD5, .npy, and
// the locked, atomic build-or-load of one cache entry.
#include "megatron/core/datasets/dataset_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::datasets {
namespace fs = std::filesystem;

// ---- PyJson ------------------------------------------------------------------------------------

PyJson PyJson::array(Array items) {
  PyJson j;
  j.v_ = std::move(items);
  return j;
}

PyJson PyJson::object(Object items) {
  PyJson j;
  j.v_ = std::move(items);
  return j;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "NaN";  // json.dumps spells the non-finite values this way
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  MG_CHECK(res.ec == std::errc(), "python_float_repr: to_chars failed");
  const std::string sci(buf, res.ptr);  // "-d.ddde+XX", shortest round-trip digits
  std::size_t pos = 0;
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  const std::size_t e_pos = sci.find('e');
  std::string digits;
  for (std::size_t i = pos; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exp10 + 1;  // value = 0.<digits> * 10^decpt
  const int n = static_cast<int>(digits.size());
  std::string out = sign;
  if (decpt <= -4 || decpt > 16) {  // Python's repr switches to exponent notation here
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(static_cast<std::size_t>(decpt - n), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
           digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

namespace {

// json.dumps(s, ensure_ascii=True): UTF-8 in, \uXXXX (surrogate pairs above U+FFFF) out.
void append_json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  auto hex4 = [&out](unsigned v) {
    char b[8];
    std::snprintf(b, sizeof(b), "\\u%04x", v);
    out += b;
  };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            if (c == 0x7f)
              out.push_back(static_cast<char>(c));  // Python leaves DEL as is
            else
              hex4(c);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    int len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    MG_CHECK(len > 0 && i + static_cast<std::size_t>(len) <= s.size(),
             "PyJson: invalid UTF-8 at byte " << i << " of \"" << s << "\"");
    unsigned cp = c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      MG_CHECK((cc >> 6) == 2, "PyJson: invalid UTF-8 at byte " << i << " of \"" << s << "\"");
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      hex4(0xd800 + (cp >> 10));
      hex4(0xdc00 + (cp & 0x3ff));
    } else {
      hex4(cp);
    }
    i += static_cast<std::size_t>(len);
  }
  out.push_back('"');
}

}  // namespace

void PyJson::dump(std::string& out, int indent, int depth) const {
  const std::string pad_in(static_cast<std::size_t>(indent * (depth + 1)), ' ');
  const std::string pad_out(static_cast<std::size_t>(indent * depth), ' ');
  if (std::holds_alternative<std::monostate>(v_)) {
    out += "null";
  } else if (const bool* b = std::get_if<bool>(&v_)) {
    out += *b ? "true" : "false";
  } else if (const int64_t* i = std::get_if<int64_t>(&v_)) {
    out += std::to_string(*i);
  } else if (const double* d = std::get_if<double>(&v_)) {
    out += python_float_repr(*d);
  } else if (const std::string* s = std::get_if<std::string>(&v_)) {
    append_json_string(out, *s);
  } else if (const Array* a = std::get_if<Array>(&v_)) {
    if (a->empty()) {
      out += "[]";
      return;
    }
    out += "[\n";
    for (std::size_t k = 0; k < a->size(); ++k) {
      out += pad_in;
      (*a)[k].dump(out, indent, depth + 1);
      out += k + 1 < a->size() ? ",\n" : "\n";
    }
    out += pad_out + "]";
  } else {
    const Object& o = std::get<Object>(v_);
    if (o.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    for (std::size_t k = 0; k < o.size(); ++k) {
      out += pad_in;
      append_json_string(out, o[k].first);
      out += ": ";
      o[k].second.dump(out, indent, depth + 1);
      out += k + 1 < o.size() ? ",\n" : "\n";
    }
    out += pad_out + "}";
  }
}

std::string PyJson::dumps(int indent) const {
  MG_CHECK(indent > 0, "PyJson::dumps: indent must be > 0, got " << indent);
  std::string out;
  dump(out, indent, 0);
  return out;
}

PyJson legacy_tokenizer_identifiers(
    const std::string& class_name, const std::vector<std::optional<std::string>>& paths,
    const std::vector<std::pair<std::string, std::string>>& options) {
  PyJson::Array p;
  for (const auto& path : paths) p.push_back(path ? PyJson(*path) : PyJson());
  PyJson::Object o{{"class", PyJson(class_name)}, {"tokenizer_path", PyJson::array(std::move(p))}};
  for (const auto& [k, v] : options) o.emplace_back(k, PyJson(v));
  return PyJson::object(std::move(o));
}

PyJson megatron_tokenizer_identifiers(const tokenizers::TokenizerArgs& t) {
  const std::string& type = t.tokenizer_type;
  auto str_or_none = [](const std::string& s) { return PyJson(s.empty() ? "None" : s); };
  const bool sp = type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
                  type == "Llama2Tokenizer";
  if (t.legacy_tokenizer) {
    if (type == "GPT2BPETokenizer")
      return legacy_tokenizer_identifiers("_GPT2BPETokenizer", {t.vocab_file, t.merge_file});
    if (sp)
      return legacy_tokenizer_identifiers("_" + type, {t.tokenizer_model},
                                          {{"vocab_extra_ids", "0"}});
    if (type == "HuggingFaceTokenizer")
      return legacy_tokenizer_identifiers("_HuggingFaceTokenizer", {t.tokenizer_model});
    if (type == "NullTokenizer")
      return legacy_tokenizer_identifiers(
          "_NullTokenizer", {std::nullopt},
          {{"vocab_size", std::to_string(t.vocab_size.value_or(0))}});
    MG_THROW("megatron_tokenizer_identifiers: no Megatron-LM identity for --tokenizer-type '"
             << type << "'");
  }
  PyJson::Object o{{"class", PyJson("megatron.core.tokenizers.text.models.default_tokenizer."
                                    "DefaultTokenizerText")}};
  const PyJson py_true("True"), py_false("False");
  const PyJson include_special(t.tokenizer_hf_include_special_tokens ? "True" : "False");
  if (type == "GPT2BPETokenizer") {
    o.emplace_back("tokenizer_path", PyJson("GPT2BPETokenizer"));
    o.emplace_back("additional_special_tokens", PyJson("[]"));
    o.emplace_back("vocab_file", str_or_none(t.vocab_file));
    o.emplace_back("merges_file", str_or_none(t.merge_file));
    o.emplace_back("use_fast", py_true);
    o.emplace_back("trust_remote_code", py_false);
    o.emplace_back("include_special_tokens", include_special);
  } else if (sp) {
    o.emplace_back("tokenizer_path", PyJson(t.tokenizer_model));
    o.emplace_back("legacy", py_false);
    o.emplace_back("special_tokens", PyJson("None"));
  } else if (type == "HuggingFaceTokenizer") {
    o.emplace_back("tokenizer_path", PyJson(t.tokenizer_model));
    o.emplace_back("vocab_file", str_or_none(t.vocab_file));
    o.emplace_back("merges_file", str_or_none(t.merge_file));
    o.emplace_back("additional_special_tokens", PyJson("[]"));
    o.emplace_back("use_fast", py_true);
    o.emplace_back("trust_remote_code", py_false);
    o.emplace_back("include_special_tokens", include_special);
  } else if (type == "NullTokenizer") {
    o.emplace_back("tokenizer_path", PyJson());
    if (t.vocab_size && *t.vocab_size != 0)
      o.emplace_back("vocab_size", PyJson(std::to_string(*t.vocab_size)));
  } else {
    MG_THROW("megatron_tokenizer_identifiers: no Megatron-LM identity for --tokenizer-type '"
             << type << "'");
  }
  return PyJson::object(std::move(o));
}

// ---- MD5 (RFC 1321) ----------------------------------------------------------------------------

std::string md5_hex(std::string_view bytes) {
  static constexpr std::array<uint32_t, 64> kK = [] {
    std::array<uint32_t, 64> k{};
    // K[i] = floor(2^32 * |sin(i + 1)|), tabulated by the RFC; computed here at compile time would
    // need constexpr sin, so the table is written out.
    const uint32_t t[64] = {0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a,
                            0xa8304613, 0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be,
                            0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340,
                            0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
                            0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8,
                            0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c,
                            0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
                            0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
                            0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92,
                            0xffeff47d, 0x85845dd1, 0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1,
                            0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
    for (int i = 0; i < 64; ++i) k[static_cast<std::size_t>(i)] = t[i];
    return k;
  }();
  static constexpr int kS[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
  uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  std::string msg(bytes);
  const uint64_t bit_len = static_cast<uint64_t>(bytes.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back('\0');
  for (int i = 0; i < 8; ++i) msg.push_back(static_cast<char>((bit_len >> (8 * i)) & 0xff));
  auto rotl = [](uint32_t x, int c) { return (x << c) | (x >> (32 - c)); };
  for (std::size_t chunk = 0; chunk < msg.size(); chunk += 64) {
    uint32_t m[16];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + chunk + 4 * i);
      m[i] = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
             (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; ++i) {
      uint32_t f;
      int g;
      if (i < 16) {
        f = (b & c) | (~b & d);
        g = i;
      } else if (i < 32) {
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
      } else if (i < 48) {
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
      } else {
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
      }
      const uint32_t tmp = d;
      d = c;
      c = b;
      b = b + rotl(a + f + kK[static_cast<std::size_t>(i)] + m[g], kS[i]);
      a = tmp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
  }
  std::string out;
  char buf[3];
  for (uint32_t v : h)
    for (int i = 0; i < 4; ++i) {
      std::snprintf(buf, sizeof(buf), "%02x", (v >> (8 * i)) & 0xff);
      out += buf;
    }
  return out;
}

// ---- .npy --------------------------------------------------------------------------------------

namespace {

struct DescrInfo {
  std::size_t size;
  bool is_signed;
};

std::optional<DescrInfo> int_descr(const std::string& descr) {
  if (descr == "<i2") return DescrInfo{2, true};
  if (descr == "<i4") return DescrInfo{4, true};
  if (descr == "<i8") return DescrInfo{8, true};
  if (descr == "<u4") return DescrInfo{4, false};
  if (descr == "|u1" || descr == "|i1") return DescrInfo{1, descr[1] == 'i'};
  if (descr == "<u2") return DescrInfo{2, false};
  if (descr == "<u8") return DescrInfo{8, false};
  return std::nullopt;
}

std::string shape_repr(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "()";
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> NpyArray::to_int64() const {
  const auto info = int_descr(descr);
  MG_CHECK(info.has_value(), "NpyArray: descr '" << descr << "' is not an integer type");
  const std::size_t n = static_cast<std::size_t>(numel());
  MG_CHECK(data.size() == n * info->size,
           "NpyArray: " << data.size() << " data bytes for " << n << " x " << info->size);
  std::vector<int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    uint64_t u = 0;
    std::memcpy(&u, data.data() + i * info->size, info->size);  // little-endian host
    if (info->is_signed && info->size < 8) {
      const unsigned shift = static_cast<unsigned>(64 - 8 * info->size);
      out[i] = static_cast<int64_t>(u << shift) >> shift;
    } else {
      out[i] = static_cast<int64_t>(u);
    }
  }
  return out;
}

std::string npy_bytes(const NpyArray& array) {
  // numpy.lib.format._write_array_header: sorted keys, repr values, 21 - len(repr(shape[0]))
  // spaces of growth room, then spaces and '\n' up to a multiple of 64 (a full 64 when aligned).
  std::string header = "{'descr': '" + array.descr +
                       "', 'fortran_order': False, 'shape': " + shape_repr(array.shape) + ", }";
  if (!array.shape.empty()) {
    const std::size_t digits = std::to_string(array.shape[0]).size();
    if (digits < 21) header += std::string(21 - digits, ' ');
  }
  const std::size_t hlen = header.size() + 1;
  const std::size_t padlen = 64 - ((10 + hlen) % 64);
  header += std::string(padlen, ' ') + "\n";
  MG_CHECK(header.size() <= 65535, "npy_bytes: header of " << header.size() << " bytes");
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(array.data.data()), array.data.size());
  return out;
}

NpyArray make_npy(std::string descr, std::vector<int64_t> shape,
                  const std::vector<int64_t>& values) {
  const auto info = int_descr(descr);
  MG_CHECK(info.has_value(), "make_npy: descr '" << descr << "' is not an integer type");
  NpyArray a;
  a.descr = std::move(descr);
  a.shape = std::move(shape);
  MG_CHECK(a.numel() == static_cast<int64_t>(values.size()),
           "make_npy: " << values.size() << " values for shape " << shape_repr(a.shape));
  a.data.resize(values.size() * info->size);
  for (std::size_t i = 0; i < values.size(); ++i)
    std::memcpy(a.data.data() + i * info->size, &values[i], info->size);  // little-endian host
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in.good(), "read_npy: cannot open " << path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MG_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, "\x93NUMPY") == 0,
           "read_npy: " << path << " is not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    MG_CHECK(bytes.size() >= 12, "read_npy: " << path << " is truncated in its header");
    for (int i = 0; i < 4; ++i)
      hlen |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    hstart = 12;
  } else {
    MG_CHECK(false,
             "read_npy: " << path << " has format version " << major << ", expected 1, 2 or 3");
  }
  MG_CHECK(hstart + hlen <= bytes.size(),
           "read_npy: " << path << " header length " << hlen << " exceeds the file");
  const std::string header = bytes.substr(hstart, hlen);
  auto field = [&](const std::string& key) {
    const std::size_t k = header.find("'" + key + "':");
    MG_CHECK(k != std::string::npos,
             "read_npy: " << path << " header has no '" << key << "': " << header);
    std::size_t v = k + key.size() + 3;
    while (v < header.size() && header[v] == ' ') ++v;
    return v;
  };
  NpyArray a;
  std::size_t v = field("descr");
  MG_CHECK(v < header.size() && header[v] == '\'',
           "read_npy: " << path << " descr is not a string");
  const std::size_t vend = header.find('\'', v + 1);
  MG_CHECK(vend != std::string::npos, "read_npy: " << path << " descr is unterminated");
  a.descr = header.substr(v + 1, vend - v - 1);
  const auto info = int_descr(a.descr);
  MG_CHECK(info.has_value(), "read_npy: " << path << " has descr '" << a.descr
                                          << "', expected a little-endian integer type");
  v = field("fortran_order");
  MG_CHECK(header.compare(v, 5, "False") == 0,
           "read_npy: " << path << " is Fortran-ordered; only C order is supported");
  v = field("shape");
  MG_CHECK(v < header.size() && header[v] == '(', "read_npy: " << path << " shape is not a tuple");
  const std::size_t send = header.find(')', v);
  MG_CHECK(send != std::string::npos, "read_npy: " << path << " shape is unterminated");
  std::string dims = header.substr(v + 1, send - v - 1);
  std::stringstream ss(dims);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    int64_t d = 0;
    const char* first = item.data() + b;
    const char* last = item.data() + item.find_last_not_of(' ') + 1;
    const auto r = std::from_chars(first, last, d);
    MG_CHECK(r.ec == std::errc() && r.ptr == last && d >= 0,
             "read_npy: " << path << " has a bad shape entry '" << item << "'");
    a.shape.push_back(d);
  }
  const std::size_t data_start = hstart + hlen;
  // The element count, checked against overflow (a hostile shape must not wrap to a small size).
  uint64_t want = info->size;
  for (int64_t d : a.shape)
    MG_CHECK(!__builtin_mul_overflow(want, static_cast<uint64_t>(d), &want) &&
                 want <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "read_npy: " << path << " has a shape whose size overflows: " << header);
  MG_CHECK(bytes.size() - data_start == want,
           "read_npy: " << path << " has " << bytes.size() - data_start
                        << " data bytes, its header says " << want);
  a.data.resize(want);
  if (want > 0) std::memcpy(a.data.data(), bytes.data() + data_start, want);
  return a;
}

// ---- cache entries -----------------------------------------------------------------------------

std::string cache_base_path(const std::string& dir, const std::string& description,
                            std::string_view class_name, std::string_view split) {
  return (fs::path(dir) /
          (md5_hex(description) + "-" + std::string(class_name) + "-" + std::string(split)))
      .string();
}

namespace {

// An exclusive flock held for the object's life.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    MG_CHECK(fd_ >= 0,
             "data cache: cannot create the lock file " << path << ": " << std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      MG_CHECK(errno == EINTR, "data cache: cannot lock " << path << ": " << std::strerror(errno));
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

void write_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MG_CHECK(out.good(),
             "data cache: cannot write " << tmp << " (pass a writable --data-cache-path)");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    MG_CHECK(out.good(), "data cache: writing " << tmp << " failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    MG_CHECK(false, "data cache: cannot rename " << tmp << " to " << path << ": " << ec.message());
  }
}

bool entry_complete(const std::string& base, const std::vector<std::string>& names) {
  if (!fs::is_regular_file(base + "-description.txt")) return false;
  for (const auto& n : names)
    if (!fs::is_regular_file(base + "-" + n + ".npy")) return false;
  return true;
}

std::vector<NpyArray> load_entry(const std::string& base, const std::vector<std::string>& names) {
  std::vector<NpyArray> out;
  for (const auto& n : names) out.push_back(read_npy(base + "-" + n + ".npy"));
  return out;
}

}  // namespace

std::vector<NpyArray> load_or_build_cached(const std::string& base, const std::string& description,
                                           const std::vector<std::string>& names,
                                           const std::function<std::vector<NpyArray>()>& build) {
  if (entry_complete(base, names)) return load_entry(base, names);
  const fs::path dir = fs::path(base).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  MG_CHECK(!ec, "data cache: cannot create the directory "
                    << dir.string() << ": " << ec.message()
                    << " (pass a writable --data-cache-path)");
  FileLock lock(base + ".lock");
  if (entry_complete(base, names)) return load_entry(base, names);  // another rank built it
  std::vector<NpyArray> arrays = build();
  MG_CHECK(arrays.size() == names.size(),
           "data cache: build() returned " << arrays.size() << " arrays for " << names.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    write_atomically(base + "-" + names[i] + ".npy", npy_bytes(arrays[i]));
  write_atomically(base + "-description.txt", description);  // last: marks the entry complete
  return arrays;
}

}  // namespace mg::datasets
