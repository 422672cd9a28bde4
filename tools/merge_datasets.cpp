// merge_datasets: Megatron's tools/merge_datasets.py in C++. Concatenates every indexed dataset
// (`<prefix>.bin` + `<prefix>.idx`) in one folder, in sorted prefix order, into one
// `<output-prefix>.{bin,idx}` with IndexedDatasetBuilder::add_index (FORMATS.md §1.6).
//
//   merge_datasets --input DIR --output-prefix OUT
//
// As in Megatron: every regular file of DIR counts, and each file's stem must have both a .bin
// and a .idx (a stray file is an error naming it); the dtype is the first dataset's and every
// other must match; the result is byte-identical to Megatron's. The output appears only when
// complete (the builder writes temporaries and renames them).
// Deviations: an empty folder is a clear error (Megatron fails on None.finalize); an output prefix
// without a folder part writes to the working directory (Megatron requires a folder part);
// the output may not be inside --input (it would be merged into itself on a re-run).
// Not supported: --multimodal (the sequence_modes array).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/indexed_dataset.h"

namespace {
namespace fs = std::filesystem;
using mg::datasets::get_bin_path;
using mg::datasets::get_idx_path;
using mg::datasets::IndexedDataset;
using mg::datasets::IndexedDatasetBuilder;

void run(const std::string& input, const std::string& output_prefix) {
  MG_CHECK(fs::is_directory(input), "--input " << input << " is not a directory or does not exist");
  const fs::path out_dir = fs::path(output_prefix).parent_path();
  MG_CHECK(out_dir.empty() || fs::is_directory(out_dir),
           "--output-prefix " << output_prefix << ": folder " << out_dir.string()
                              << " is not a directory or does not exist");
  MG_CHECK(out_dir.empty() ? !fs::equivalent(fs::current_path(), input)
                           : !fs::equivalent(out_dir, input),
           "--output-prefix " << output_prefix << " is inside --input " << input
                              << "; write the merged dataset elsewhere");
  // Python's os.path.splitext on every regular file; sorted() of str is code-point order, which
  // std::string's byte order equals for UTF-8.
  std::set<std::string> prefixes;
  for (const auto& e : fs::directory_iterator(input)) {
    if (!e.is_regular_file()) continue;
    const fs::path p = e.path();
    const std::string stem = (p.parent_path() / p.stem()).string();
    if (prefixes.count(stem)) continue;
    const std::string ext = p.extension().string();
    const std::string pair = ext == ".idx" ? ".bin" : ".idx";
    MG_CHECK(ext == ".bin" || ext == ".idx",
             p.string() << " is not a .bin or .idx file; --input must hold only indexed datasets");
    MG_CHECK(fs::is_regular_file(stem + pair),
             pair << " file not provided for " << stem << " (from " << p.filename().string()
                  << "; every file in --input must be half of a .bin/.idx pair)");
    prefixes.insert(stem);
  }
  MG_CHECK(!prefixes.empty(), "--input " << input << " holds no .bin/.idx pair to merge");
  std::optional<IndexedDatasetBuilder> builder;
  std::size_t sequences = 0;
  for (const std::string& prefix : prefixes) {
    if (!builder) builder.emplace(get_bin_path(output_prefix), IndexedDataset(prefix).dtype());
    builder->add_index(prefix);
    sequences = builder->sequence_count();
  }
  builder->finalize(get_idx_path(output_prefix));
  std::printf("merged %zu datasets (%zu sequences) into %s.{bin,idx}\n", prefixes.size(), sequences,
              output_prefix.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Merge the indexed datasets of a folder (Megatron's tools/merge_datasets.py)"};
  std::string input, output_prefix;
  app.add_option("--input", input, "Folder holding the .bin/.idx pairs to merge")->required();
  app.add_option("--output-prefix", output_prefix, "Writes <prefix>.bin and <prefix>.idx")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    run(input, output_prefix);
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "merge_datasets: error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "merge_datasets: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
