// Tests of the cache-file pieces (megatron/core/datasets/dataset_cache.h): Python's float repr and
// json.dumps(indent=4), MD5 against RFC 1321's vectors, .npy bytes and validation, and the locked
// build-or-load under concurrent callers (build runs once, nobody sees a partial entry).
#include "megatron/core/datasets/dataset_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/common/error.h"

namespace mg::datasets {
namespace {
namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("mg_cache_test_" + std::to_string(::getpid()) + name);
  fs::remove_all(p);
  return p;
}

TEST(PythonFloatRepr, MatchesPython) {
  // Values and their Python 3 repr().
  const std::vector<std::pair<double, std::string>> cases = {
      {0.99, "0.99"},
      {1.0, "1.0"},
      {0.1 + 0.2, "0.30000000000000004"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456.5, "123456.5"},
      {-2.5e-7, "-2.5e-07"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.5e300, "1.5e+300"},
      {0.3333333333333333, "0.3333333333333333"},
      {100.0, "100.0"},
      {1234567890123456.7, "1234567890123456.8"}};
  for (const auto& [v, want] : cases) EXPECT_EQ(python_float_repr(v), want) << want;
}

TEST(PyJson, DumpsLikePythonIndent4) {
  PyJson j = PyJson::object({{"a", PyJson(int64_t{1})},
                             {"b", PyJson::array({PyJson(), PyJson(true), PyJson(0.5)})},
                             {"c", PyJson::array({})},
                             {"d", PyJson::object({})},
                             {"e", PyJson("q\"\\\n\x01é😀")}});
  // json.dumps({...}, indent=4) in Python 3.
  EXPECT_EQ(j.dumps(4),
            "{\n    \"a\": 1,\n    \"b\": [\n        null,\n        true,\n        0.5\n    ],\n"
            "    \"c\": [],\n    \"d\": {},\n"
            "    \"e\": \"q\\\"\\\\\\n\\u0001\\u00e9\\ud83d\\ude00\"\n}");
  EXPECT_THROW(PyJson("\xff").dumps(4), Error);
}

TEST(Md5, Rfc1321Vectors) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(
      md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
      "57edf4a22be3c955ac49da2e2107b67a");
}

TEST(Npy, BytesAsNumpySavesThem) {
  // numpy.save of numpy.arange(3, dtype=numpy.int32): 128-byte header (the 21-digit growth room
  // pushes it past 64), then 12 data bytes.
  const std::string b = npy_bytes(make_npy("<i4", {3}, {0, 1, 2}));
  ASSERT_EQ(b.size(), 128u + 12u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(b.substr(10, 60), "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }   ");
  EXPECT_EQ(b[127], '\n');
  const std::string two = npy_bytes(make_npy("<i8", {2, 2}, {1, -2, 3, 4}));
  EXPECT_NE(two.find("'shape': (2, 2), }"), std::string::npos);
}

TEST(Npy, RoundTripsAndRejectsCorruption) {
  const fs::path dir = scratch("npy");
  fs::create_directories(dir);
  const std::string p = (dir / "a.npy").string();
  const std::vector<int64_t> v = {-5, 0, 32767, -32768};
  {
    std::ofstream out(p, std::ios::binary);
    out << npy_bytes(make_npy("<i2", {4}, v));
  }
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.descr, "<i2");
  EXPECT_EQ(a.to_int64(), v);
  {  // Found by fuzz_npy: an empty array (memcpy from a null pointer before the fix).
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << npy_bytes(make_npy("<i8", {0}, {}));
  }
  EXPECT_EQ(read_npy(p).numel(), 0);
  const std::string good = npy_bytes(make_npy("<u4", {2}, {1, 4294967295}));
  EXPECT_EQ(NpyArray(make_npy("<u4", {2}, {1, 4294967295})).to_int64(),
            (std::vector<int64_t>{1, 4294967295}));
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    try {
      read_npy(p);
      FAIL() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("NUMPY", "bad magic");
  expect_error(good.substr(0, good.size() - 1), "data bytes");
  std::string f = good;
  f.replace(f.find("<u4"), 3, "<f4");
  expect_error(f, "descr '<f4'");
  f = good;
  f.replace(f.find("False"), 5, "True ");
  expect_error(f, "Fortran");
  // Seen while fixing fuzz_npy's finding: a shape whose byte size overflows must not wrap.
  f = good;
  f.replace(f.find("(2,)"), 4, "(4611686018427387904, 4)");
  expect_error(f, "overflows");
  f = good;
  f[8] = '\xff';
  f[9] = '\xff';
  expect_error(f, "exceeds the file");
  fs::remove_all(dir);
}

TEST(LoadOrBuildCached, BuildsOnceUnderConcurrentCallers) {
  const fs::path dir = scratch("conc");
  const std::string base = (dir / "sub" / "abc-GPTDataset-train").string();
  std::atomic<int> builds{0};
  std::vector<std::vector<int64_t>> results(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      auto arrays = load_or_build_cached(base, "desc", {"x", "y"}, [&] {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return std::vector<NpyArray>{make_npy("<i8", {3}, {7, 8, 9}), make_npy("<i4", {1}, {5})};
      });
      results[static_cast<std::size_t>(t)] = arrays[0].to_int64();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(builds.load(), 1);
  for (const auto& r : results) EXPECT_EQ(r, (std::vector<int64_t>{7, 8, 9}));
  // Complete entry, no temporaries left.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir / "sub")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 4);  // description, x, y, lock
  // A later call loads without building.
  load_or_build_cached(base, "desc", {"x", "y"}, [&]() -> std::vector<NpyArray> {
    ADD_FAILURE() << "rebuilt a complete entry";
    return {};
  });
  fs::remove_all(dir);
}

TEST(LoadOrBuildCached, AnEntryWithoutItsDescriptionIsRebuilt) {
  // A crash between the arrays and the description leaves no description: not a hit.
  const fs::path dir = scratch("partial");
  fs::create_directories(dir);
  const std::string base = (dir / "h-GPTDataset-valid").string();
  {
    std::ofstream out(base + "-x.npy", std::ios::binary);
    out << "garbage";
  }
  int builds = 0;
  auto arrays = load_or_build_cached(base, "d", {"x"}, [&] {
    ++builds;
    return std::vector<NpyArray>{make_npy("<i4", {1}, {42})};
  });
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(arrays[0].to_int64(), (std::vector<int64_t>{42}));
  EXPECT_EQ(read_npy(base + "-x.npy").to_int64(), (std::vector<int64_t>{42}));
  fs::remove_all(dir);
}

TEST(LoadOrBuildCached, UnwritableDirectoryIsAClearError) {
  // A regular file where the cache folder should be: fails even for root.
  const fs::path dir = scratch("unwritable");
  fs::create_directories(dir);
  { std::ofstream(dir / "file") << "x"; }
  try {
    load_or_build_cached((dir / "file" / "sub" / "x").string(), "d", {"x"},
                         [] { return std::vector<NpyArray>{make_npy("<i4", {1}, {1})}; });
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data-cache-path"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(LegacyTokenizerIdentifiers, AsMegatronLegacyTokenizer) {
  EXPECT_EQ(legacy_tokenizer_identifiers("_NullTokenizer", {std::nullopt}, {{"vocab_size", "128"}})
                .dumps(4),
            "{\n    \"class\": \"_NullTokenizer\",\n    \"tokenizer_path\": [\n        null\n    ],"
            "\n    \"vocab_size\": \"128\"\n}");
}

}  // namespace
}  // namespace mg::datasets
