// Sharded checkpoint save/load throughput on one rank (benchmarks/run_checkpoint_io.sh runs it
// beside `dd`). A GPT-shaped f32 model (Megatron-Core names, ~94M parameters at the default
// size) with Adam's exp_avg / exp_avg_sq: ~1 GB of state. Prints one JSON object:
//   save_s / save_gbs            synchronous save_checkpoint (fsynced files, renames)
//   async_return_s / async_total_s  --async-save: time until save_checkpoint returns (host copy)
//                                and until AsyncCheckpointSaver::finalize() has made it durable
//   load_cold_s / load_cold_gbs  load_checkpoint after evicting the files from the page cache
//                                (posix_fadvise DONTNEED after fsync: clean pages are dropped)
//   load_warm_s / load_warm_gbs  load_checkpoint again (files in the page cache)
//   xxh3_s / xxh3_gbs            XXH3-64 over the whole state in memory (the checksums' own cost)
// and checks that the loaded parameters and optimizer state equal the saved ones.
//   checkpoint_io_bench <dir> [hidden=1024] [layers=4] [reps=2] [checksum=1]
// (checksum 0: saves without the per-tensor XXH3-64 and loads without verifying,
// --no-ckpt-checksum)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/training/checkpointing.h"

namespace fs = std::filesystem;
using mg::DType;
using mg::Shape;
using mg::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void evict(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

Tensor filled(const Shape& shape, float base) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = base + static_cast<float>(i % 1021) * 1e-3f;
  return t;
}

struct Model {
  std::vector<mg::transformer::Parameter> params;
  mg::optimizer::StateDict opt;
};

Model make_model(int64_t h, int64_t layers, float base) {
  Model m;
  auto add = [&](const std::string& name, Shape shape, int dim, int stride) {
    mg::transformer::Parameter p;
    p.name = name;
    p.param = filled(shape, base);
    p.global_shape = shape;
    p.tensor_parallel_dim = dim;
    p.partition_stride = stride;
    m.params.push_back(p);
    m.opt.tensors["optimizer.state.exp_avg." + name] = filled(shape, base + 1.f);
    m.opt.tensors["optimizer.state.exp_avg_sq." + name] = filled(shape, base + 2.f);
  };
  add("embedding.word_embeddings.weight", {50304, h}, 0, 1);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string pre = "decoder.layers." + std::to_string(l) + ".";
    add(pre + "self_attention.linear_qkv.layer_norm_weight", {h}, -1, 1);
    add(pre + "self_attention.linear_qkv.weight", {3 * h, h}, 0, 1);
    add(pre + "self_attention.linear_proj.weight", {h, h}, 1, 1);
    add(pre + "mlp.linear_fc1.layer_norm_weight", {h}, -1, 1);
    add(pre + "mlp.linear_fc1.weight", {4 * h, h}, 0, 2);  // [gate; up], ffn 2h
    add(pre + "mlp.linear_fc2.weight", {h, 2 * h}, 1, 1);
  }
  add("decoder.final_layernorm.weight", {h}, -1, 1);
  m.opt.numbers["step"] = 10;
  m.opt.strings["optimizer"] = "adam";
  return m;
}

double state_bytes(const Model& m) {
  double b = 0;
  for (const auto& p : m.params) b += static_cast<double>(p.param.nbytes());
  for (const auto& [k, t] : m.opt.tensors) b += static_cast<double>(t.nbytes());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: checkpoint_io_bench <dir> [hidden=1024] [layers=4] [reps=2] "
                 "[checksum=1 (0: --no-ckpt-checksum)]\n";
    return 2;
  }
  const std::string root = argv[1];
  const int64_t h = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t layers = argc > 3 ? std::atoll(argv[3]) : 4;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 2;
  const bool checksum = argc > 5 ? std::atoi(argv[5]) != 0 : true;
  try {
    Model src = make_model(h, layers, 1.f);
    const double bytes = state_bytes(src);
    mg::training::CheckpointState st;
    st.optimizer = src.opt;
    double save_best = 1e30, async_ret = 1e30, async_total = 1e30, cold = 1e30, warm = 1e30;
    // The checksums' own cost: XXH3-64 over the whole state in memory (what a save adds, and a
    // warm load adds to its copies).
    double hash_best = 1e30;
    std::vector<const Tensor*> all;
    for (const auto& p : src.params) all.push_back(&p.param);
    for (const auto& [k, t] : src.opt.tensors) all.push_back(&t);
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      std::size_t sink = 0;
      for (const Tensor* t : all)
        sink += mg::dist_checkpointing::checksum_hex(
                    {static_cast<const std::byte*>(t->raw_data()), t->nbytes()})
                    .size();
      if (sink == 0) return 1;
      hash_best = std::min(hash_best, since(t0));
    }
    for (int r = 0; r < reps; ++r) {
      st.iteration = 2 * r + 1;
      auto t0 = Clock::now();
      mg::training::SaveOptions sync;
      sync.checksums = checksum;
      mg::training::save_checkpoint(root, src.params, st, {}, sync);
      save_best = std::min(save_best, since(t0));
      st.iteration = 2 * r + 2;
      mg::training::SaveOptions async;
      async.async = true;
      async.checksums = checksum;
      t0 = Clock::now();
      mg::training::AsyncCheckpointSaver saver;
      mg::training::save_checkpoint(root, src.params, st, {}, async, &saver);
      async_ret = std::min(async_ret, since(t0));
      saver.finalize();
      async_total = std::min(async_total, since(t0));
    }
    Model dst = make_model(h, layers, 0.f);
    mg::training::LoadOptions lo;
    lo.optimizer_template = dst.opt;
    lo.verify_checksums = checksum;
    for (int r = 0; r < reps; ++r) {
      evict(root);
      auto t0 = Clock::now();
      auto loaded = mg::training::load_checkpoint(root, dst.params, lo);
      cold = std::min(cold, since(t0));
      t0 = Clock::now();
      loaded = mg::training::load_checkpoint(root, dst.params, lo);
      warm = std::min(warm, since(t0));
      for (std::size_t i = 0; i < src.params.size(); ++i) {
        const auto& a = src.params[i].param;
        const auto& b = dst.params[i].param;
        if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) {
          std::cerr << "MISMATCH in " << src.params[i].name << "\n";
          return 1;
        }
      }
      for (const auto& [k, t] : src.opt.tensors) {
        const Tensor& u = loaded.optimizer->tensor(k);
        if (std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()) != 0) {
          std::cerr << "MISMATCH in " << k << "\n";
          return 1;
        }
      }
    }
    const double gb = bytes / 1e9;
    std::printf(
        "{\"state_gb\": %.4f, \"params\": %zu, \"reps\": %d, \"save_s\": %.3f, \"save_gbs\": "
        "%.3f, \"checksum\": %d, \"xxh3_s\": %.3f, \"xxh3_gbs\": %.2f, \"async_return_s\": %.3f, "
        "\"async_total_s\": %.3f, "
        "\"load_cold_s\": %.3f, "
        "\"load_cold_gbs\": %.3f, \"load_warm_s\": %.3f, \"load_warm_gbs\": %.3f}\n",
        gb, src.params.size(), reps, save_best, gb / save_best, checksum ? 1 : 0, hash_best,
        gb / hash_best, async_ret, async_total, cold, gb / cold, warm, gb / warm);
  } catch (const std::exception& e) {
    std::cerr << "checkpoint_io_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
