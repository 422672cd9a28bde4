// Test helpers for the tensor-parallel tests: a one-member ProcessGroup (the single-rank reference
// layers run on it in every process, with no MPI), deterministic inputs, and a module context.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/transformer_config.h"

namespace mg::test {

// A group holding only this process: every collective is a copy.
class SoloGroup final : public comm::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "solo"; }
  comm::WorkPtr all_reduce(Tensor&, comm::ReduceOp) override { return done(); }
  comm::WorkPtr all_gather(Tensor& out, const Tensor& in) override { return copy(out, in); }
  comm::WorkPtr reduce_scatter(Tensor& out, const Tensor& in, comm::ReduceOp) override {
    return copy(out, in);
  }
  comm::WorkPtr broadcast(Tensor&, int) override { return done(); }
  comm::WorkPtr all_to_all(Tensor& out, const Tensor& in) override { return copy(out, in); }
  comm::WorkPtr all_to_all_v(Tensor& out, const Tensor& in, std::span<const int64_t>,
                             std::span<const int64_t>) override {
    return copy(out, in);
  }
  comm::WorkPtr send(const Tensor&, int, int) override { MG_THROW("SoloGroup: send"); }
  comm::WorkPtr recv(Tensor&, int, int) override { MG_THROW("SoloGroup: recv"); }
  comm::WorkPtr batch_isend_irecv(std::span<const comm::P2POp>) override {
    MG_THROW("SoloGroup: batch_isend_irecv");
  }
  void barrier() override {}
  void set_timeout(std::chrono::milliseconds) override {}

 private:
  struct Done final : comm::Work {
    void wait() override {}
    bool is_completed() override { return true; }
  };
  static comm::WorkPtr done() { return std::make_unique<Done>(); }
  static comm::WorkPtr copy(Tensor& out, const Tensor& in) {
    out.copy_(in);
    return done();
  }
  std::vector<int> ranks_{0};
  std::string name_ = "solo";
};

// Deterministic values in [-1, 1] (never all zero), identical in every process.
inline std::vector<double> det_values(std::size_t n, uint64_t seed) {
  std::vector<double> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<double>(x >> 11) * (2.0 / 9007199254740992.0) - 1.0;
  }
  return v;
}

inline Tensor det_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  return Tensor::from_vector(det_values(static_cast<std::size_t>(shape_numel(shape)), seed), shape,
                             dtype);
}

}  // namespace mg::test
