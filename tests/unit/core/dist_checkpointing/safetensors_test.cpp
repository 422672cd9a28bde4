// safetensors reader/writer: round trip of every dtype, the reference layout, and the strict
// reader's refusals (truncation, trailing bytes, holes, overlaps, bad sizes, duplicate keys).
#include "megatron/core/dist_checkpointing/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/unit/test_util.h"

namespace mg::dist_checkpointing {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("mg_safetensors_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

// Writes a file with an explicit header and data buffer.
std::string write_raw(const std::string& name, const std::string& header, std::size_t data_bytes) {
  const std::string p = temp_path(name);
  std::ofstream f(p, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header << std::string(data_bytes, '\0');
  return p;
}

std::string open_error(const std::string& path) {
  return test::error_message([&] { SafetensorsFile f(path); });
}

TEST(Safetensors, RoundTripEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> ts;
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2,
                  DType::i32, DType::i64, DType::u8}) {
    std::vector<double> v = {1, -2, 3, 0.5, 7, 8};
    ts.emplace_back(std::string("t.") + std::string(dtype_name(d)),
                    Tensor::from_vector(v, {2, 3}, d));
  }
  ts.emplace_back("scalar", Tensor::from_vector(std::vector<float>{42.f}, {}));
  ts.emplace_back("empty", Tensor::from_vector(std::vector<float>{}, {0, 4}));
  const std::string p = temp_path("all.safetensors");
  save_safetensors(p, ts, {{"format", "pt"}});
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.names().size(), ts.size());
  for (const auto& [name, t] : ts) {
    Tensor r = f.tensor(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.to_vector<double>(), t.to_vector<double>()) << name;
  }
  // Reference layout: 8-byte aligned data start, widest dtypes first.
  EXPECT_EQ(f.entry("t.i64").begin, 0u);
  EXPECT_EQ(fs::file_size(p) % 8, (fs::file_size(p) - 8) % 8);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(Safetensors, HeaderIsPaddedAndCompact) {
  const std::string p = temp_path("pad.safetensors");
  save_safetensors(p, {{"a", Tensor::from_vector(std::vector<float>{1, 2}, {2})}});
  std::ifstream f(p, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, ' ');
  f.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
}

TEST(Safetensors, TruncatedFileIsRefused) {
  const std::string p = temp_path("trunc.safetensors");
  save_safetensors(p, {{"w", Tensor::from_vector(std::vector<float>(64, 1.f), {8, 8})}});
  fs::resize_file(p, fs::file_size(p) - 4);
  EXPECT_NE(open_error(p).find("is truncated"), std::string::npos) << open_error(p);
  fs::resize_file(p, 5);
  EXPECT_NE(open_error(p).find("truncated"), std::string::npos) << open_error(p);
}

TEST(Safetensors, TrailingBytesAreRefused) {
  const std::string p = write_raw("trail.safetensors",
                                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
  EXPECT_NE(open_error(p).find("trailing bytes"), std::string::npos) << open_error(p);
}

TEST(Safetensors, HolesOverlapsAndSizeMismatchAreRefused) {
  auto hole = write_raw("hole.safetensors",
                        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        12);
  EXPECT_NE(open_error(hole).find("hole or overlap"), std::string::npos) << open_error(hole);
  auto overlap = write_raw("overlap.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           8);
  EXPECT_NE(open_error(overlap).find("hole or overlap"), std::string::npos);
  auto size =
      write_raw("size.safetensors", R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(open_error(size).find("needs 6"), std::string::npos) << open_error(size);
}

TEST(Safetensors, BadHeadersAreRefused) {
  auto dup = write_raw("dup.safetensors",
                       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       8);
  EXPECT_NE(open_error(dup).find("duplicate key 'a'"), std::string::npos) << open_error(dup);
  auto notjson = write_raw("notjson.safetensors", "{not json", 0);
  EXPECT_NE(open_error(notjson).find("not valid JSON"), std::string::npos);
  auto nobrace = write_raw("nobrace.safetensors", "[]", 0);
  EXPECT_NE(open_error(nobrace).find("does not start with '{'"), std::string::npos);
  auto dtype = write_raw("dtype.safetensors",
                         R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(open_error(dtype).find("unknown dtype 'F33'"), std::string::npos);
  auto meta = write_raw("meta.safetensors", R"({"__metadata__":{"x":1}})", 0);
  EXPECT_NE(open_error(meta).find("not a string"), std::string::npos);
  const std::string big = temp_path("big.safetensors");
  {
    std::ofstream f(big, std::ios::binary);
    uint64_t n = 200000000;
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  }
  EXPECT_NE(open_error(big).find("header too large"), std::string::npos);
  EXPECT_NE(open_error(temp_path("missing.safetensors")).find("cannot open"), std::string::npos);
}

TEST(Safetensors, PaddedHeaderWithSpacesIsAccepted) {
  auto p = write_raw("spaces.safetensors",
                     R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}       )", 3);
  SafetensorsFile f(p);
  EXPECT_EQ(f.tensor("a").shape(), Shape{3});
  EXPECT_NE(test::error_message([&] { f.entry("b"); }).find("no tensor 'b'"), std::string::npos);
}

}  // namespace
}  // namespace mg::dist_checkpointing
