// Conformance of the cross-entropy ops (cross_entropy_fwd/bwd, ce_local_max, ce_local_stats,
// ce_combine) against a naive f64 reference on every test platform and kernel dtype, with i32 and
// i64 targets; vocab parallelism simulated on one process (V = 13 split 5+5+3 and 7+6: max over the
// shards, stats with the global max, summed, combined) must equal the serial op, loss and
// gradient; the backward in place; target validation; finite differences in f64 on cpu.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::to_doubles;

DType stat_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

std::vector<int64_t> random_targets(int64_t n, int64_t v, uint64_t seed) {
  const auto r = test::random_values(n, seed);
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int64_t>(std::abs(r[i]) * 7919.0) % v;
  return t;
}

struct CeRef {
  std::vector<double> loss, max, sum_exp, dlogits;
};

// loss[n] = log(sum_j exp(x[n, j])) - x[n, t[n]], through the max for stability; dlogits[n, j] =
// dloss[n] * (softmax(x[n])_j - [j == t[n]]).
CeRef ref_ce(const std::vector<double>& x, int64_t v, const std::vector<int64_t>& t,
             const std::vector<double>& dloss) {
  const int64_t n = static_cast<int64_t>(t.size());
  CeRef r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
          std::vector<double>(x.size())};
  for (int64_t i = 0; i < n; ++i) {
    const double* row = x.data() + i * v;
    const double m = *std::max_element(row, row + v);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
    r.max[i] = m;
    r.sum_exp[i] = s;
    r.loss[i] = std::log(s) + m - row[t[i]];
    for (int64_t j = 0; j < v; ++j)
      r.dlogits[i * v + j] = dloss[i] * (std::exp(row[j] - m) / s - (j == t[i] ? 1.0 : 0.0));
  }
  return r;
}

class CrossEntropyOp : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  const std::string& platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  DType sdt() const { return stat_dtype(dtype()); }
};

Tensor targets_tensor(const std::vector<int64_t>& t, DType idx, Device dev) {
  return Tensor::from_vector(t, {static_cast<int64_t>(t.size())}, idx).to(dev);
}

TEST_P(CrossEntropyOp, SerialMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {7, 13}, {31, 50}, {3, 1000}, {16, 7}};
  uint64_t seed = 1;
  for (const auto& [n, v] : sizes) {
    for (DType idx : {DType::i32, DType::i64}) {
      auto x = make_tensor(test::random_values(n * v, seed++, 0.1, 5.0), {n, v}, dtype(), dev);
      const auto t = random_targets(n, v, seed++);
      auto dl = make_tensor(test::random_values(n, seed++), {n}, sdt(), dev);
      const auto want = ref_ce(x.rounded, v, t, dl.rounded);
      Tensor loss = Tensor::empty({n}, sdt(), dev), mx = Tensor::empty({n}, sdt(), dev);
      Tensor se = Tensor::empty({n}, sdt(), dev);
      const Tensor tt = targets_tensor(t, idx, dev);
      ops.cross_entropy_fwd(loss, mx, se, x.t, tt);
      const auto stol = test::tolerance(sdt());  // statistics: f32 (f64) from the rounded logits
      EXPECT_TRUE(test::all_close(to_doubles(loss), want.loss, stol)) << "N " << n << " V " << v;
      EXPECT_TRUE(test::all_close(to_doubles(mx), want.max, stol)) << "N " << n << " V " << v;
      EXPECT_TRUE(test::all_close(to_doubles(se), want.sum_exp, stol)) << "N " << n << " V " << v;
      Tensor dx = Tensor::empty({n, v}, dtype(), dev);
      ops.cross_entropy_bwd(dx, dl.t, x.t, mx, se, tt, 0);
      EXPECT_TRUE(test::all_close(to_doubles(dx), want.dlogits, test::tolerance(dtype())))
          << "N " << n << " V " << v;
      // In place: the gradient overwrites the logits.
      Tensor xin = x.t.clone();
      ops.cross_entropy_bwd(xin, dl.t, xin, mx, se, tt, 0);
      EXPECT_EQ(to_doubles(xin), to_doubles(dx)) << "in place, N " << n << " V " << v;
    }
  }
}

// Split V across 2 or 3 "ranks" on one process and run the vocab-parallel pipeline with host-side
// all-reduces: the loss and the gradient columns must equal the serial op's.
TEST_P(CrossEntropyOp, VocabParallelShardsEqualSerial) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const int64_t n = 7, v = 13;
  const std::vector<std::vector<int64_t>> splits = {{5, 5, 3}, {7, 6}, {13}};
  auto x = make_tensor(test::random_values(n * v, 11, 0.1, 4.0), {n, v}, dtype(), dev);
  const auto t = random_targets(n, v, 12);
  auto dl = make_tensor(test::random_values(n, 13), {n}, sdt(), dev);
  for (DType idx : {DType::i32, DType::i64}) {
    const Tensor tt = targets_tensor(t, idx, dev);
    Tensor loss = Tensor::empty({n}, sdt(), dev), mx = Tensor::empty({n}, sdt(), dev);
    Tensor se = Tensor::empty({n}, sdt(), dev), dx = Tensor::empty({n, v}, dtype(), dev);
    ops.cross_entropy_fwd(loss, mx, se, x.t, tt);
    ops.cross_entropy_bwd(dx, dl.t, x.t, mx, se, tt, 0);
    const auto serial_loss = to_doubles(loss), serial_dx = to_doubles(dx);

    for (const auto& split : splits) {
      // Shard columns [start, start + width) of the logits.
      std::vector<Tensor> shards;
      std::vector<int64_t> starts;
      int64_t start = 0;
      for (int64_t w : split) {
        std::vector<double> cols;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = start; j < start + w; ++j) cols.push_back(x.rounded[i * v + j]);
        shards.push_back(make_tensor(cols, {n, w}, dtype(), dev).t);
        starts.push_back(start);
        start += w;
      }
      // local max -> all-reduce(max)
      std::vector<double> gmax(n, -INFINITY);
      for (const Tensor& sh : shards) {
        Tensor lm = Tensor::empty({n}, sdt(), dev);
        ops.ce_local_max(lm, sh);
        const auto lv = to_doubles(lm);
        for (int64_t i = 0; i < n; ++i) gmax[i] = std::max(gmax[i], lv[i]);
      }
      const Tensor gmax_t = make_tensor(gmax, {n}, sdt(), dev).t;
      // local stats with the global max -> all-reduce(sum)
      std::vector<double> gsum(n, 0.0), gtarget(n, 0.0);
      for (std::size_t r = 0; r < shards.size(); ++r) {
        Tensor ls = Tensor::empty({n}, sdt(), dev), lt = Tensor::empty({n}, sdt(), dev);
        ops.ce_local_stats(ls, lt, shards[r], gmax_t, tt, starts[r]);
        const auto sv = to_doubles(ls), tv = to_doubles(lt);
        for (int64_t i = 0; i < n; ++i) {
          gsum[i] += sv[i];
          gtarget[i] += tv[i];
        }
      }
      const Tensor gsum_t = make_tensor(gsum, {n}, sdt(), dev).t;
      Tensor ploss = Tensor::empty({n}, sdt(), dev);
      ops.ce_combine(ploss, gmax_t, gsum_t, make_tensor(gtarget, {n}, sdt(), dev).t);
      EXPECT_TRUE(test::all_close(to_doubles(ploss), serial_loss, test::tolerance(sdt())))
          << split.size() << " shards";
      // Each shard's gradient is the matching columns of the serial gradient.
      for (std::size_t r = 0; r < shards.size(); ++r) {
        const int64_t w = shards[r].size(1);
        Tensor pdx = Tensor::empty({n, w}, dtype(), dev);
        ops.cross_entropy_bwd(pdx, dl.t, shards[r], gmax_t, gsum_t, tt, starts[r]);
        std::vector<double> cols;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = starts[r]; j < starts[r] + w; ++j) cols.push_back(serial_dx[i * v + j]);
        EXPECT_TRUE(test::all_close(to_doubles(pdx), cols, test::tolerance(dtype())))
            << "shard " << r << " of " << split.size();
      }
    }
  }
}

TEST_P(CrossEntropyOp, RejectsBadArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const int64_t n = 3, v = 5;
  Tensor x = make_tensor(test::random_values(n * v, 3), {n, v}, dtype(), dev).t;
  Tensor loss = Tensor::empty({n}, sdt(), dev), mx = Tensor::empty({n}, sdt(), dev);
  Tensor se = Tensor::empty({n}, sdt(), dev);
  EXPECT_NO_THROW(
      ops.cross_entropy_fwd(loss, mx, se, x, targets_tensor({0, 4, 2}, DType::i64, dev)));
  // A bad target throws at the call (CPU) or at the next synchronisation, here the loss read (CUDA:
  // the kernel records it, no host round trip), naming the target and its row; the loss read
  // after that works again.
  for (auto [bad, what] : {std::pair<int64_t, const char*>{5, "target == V"}, {-1, "negative"}}) {
    try {
      ops.cross_entropy_fwd(loss, mx, se, x, targets_tensor({0, bad, 2}, DType::i64, dev));
      (void)loss.to(Device::cpu());
      ADD_FAILURE() << what << " target accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("target " + std::to_string(bad) + " of row 1"), std::string::npos)
          << e.message();
    }
    EXPECT_NO_THROW((void)loss.to(Device::cpu())) << "the error is raised once";
  }
  EXPECT_THROW(ops.cross_entropy_fwd(loss, mx, se, x, targets_tensor({0, 1}, DType::i32, dev)),
               Error)
      << "N mismatch";
  const Tensor ft = Tensor::from_vector(std::vector<float>{0, 1, 2}, {3}).to(dev);
  EXPECT_THROW(ops.cross_entropy_fwd(loss, mx, se, x, ft), Error) << "float targets";
  const DType wrong = dtype() == DType::f64 ? DType::f32 : DType::f64;
  Tensor bad_loss = Tensor::empty({n}, wrong, dev);
  EXPECT_THROW(
      ops.cross_entropy_fwd(bad_loss, mx, se, x, targets_tensor({0, 1, 2}, DType::i32, dev)), Error)
      << "loss dtype";
  Tensor dx_bad = Tensor::empty({n, v + 1}, dtype(), dev);
  EXPECT_THROW(
      ops.cross_entropy_bwd(dx_bad, loss, x, mx, se, targets_tensor({0, 1, 2}, DType::i32, dev), 0),
      Error)
      << "dlogits shape";
  Tensor se_bad = Tensor::empty({n}, wrong, dev);
  EXPECT_THROW(ops.ce_combine(loss, mx, se_bad, mx), Error) << "ce_combine dtype mix";
}

MG_INSTANTIATE_OP_TEST(CrossEntropyOp);

// d/dlogits sum_n(loss[n] * w[n]) by central differences equals cross_entropy_bwd(dloss = w).
TEST(CrossEntropyGradient, FiniteDifferencesF64) {
  const auto& ops = test::ops_on("cpu");
  const int64_t n = 5, v = 11;
  const auto x0 = test::random_values(n * v, 41, 0.1, 3.0);
  const auto w = test::random_values(n, 42);
  const auto t = random_targets(n, v, 43);
  const Tensor tt = Tensor::from_vector(t, {n});
  auto stats = [&](const std::vector<double>& xv) {
    Tensor loss = Tensor::empty({n}, DType::f64), mx = Tensor::empty({n}, DType::f64);
    Tensor se = Tensor::empty({n}, DType::f64);
    ops.cross_entropy_fwd(loss, mx, se, Tensor::from_vector(xv, {n, v}), tt);
    return std::tuple{loss, mx, se};
  };
  auto objective = [&](const std::vector<double>& xv) {
    const auto lv = std::get<0>(stats(xv)).to_vector<double>();
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += lv[i] * w[i];
    return l;
  };
  auto [loss, mx, se] = stats(x0);
  Tensor dx = Tensor::empty({n, v}, DType::f64);
  ops.cross_entropy_bwd(dx, Tensor::from_vector(w, {n}), Tensor::from_vector(x0, {n, v}), mx, se,
                        tt, 0);
  EXPECT_TRUE(test::all_close(dx.to_vector<double>(), test::numerical_gradient(objective, x0),
                              {1e-8, 1e-6}));
}

}  // namespace
}  // namespace mg
