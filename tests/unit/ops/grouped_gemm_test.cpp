// Conformance of grouped_gemm (the MoE experts' --moe-grouped-gemm op) on every platform and
// kernel dtype: each group against a naive f64 reference in the three forms the experts use
// (forward x W^T, dgrad dy W, wgrad dW += dy^T x into an f32 main_grad), groups of unequal and
// zero rows; on the CPU bit-identical to the loop of gemm calls it replaces; argument validation.
#include <algorithm>
#include <cstring>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::GemmArgs;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

using Param = test::PlatformDType;

// C = alpha op(A) @ op(B) + beta C0, row-major, f64.
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b,
                             const std::vector<double>& c0, int64_t m, int64_t n, int64_t k,
                             const GemmArgs& g) {
  std::vector<double> c(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (g.trans_a ? a[p * m + i] : a[i * k + p]) * (g.trans_b ? b[j * k + p] : b[p * n + j]);
      c[i * n + j] = g.alpha * s + (g.beta != 0 ? g.beta * c0[i * n + j] : 0.0);
    }
  return c;
}

class GroupedGemmTest : public ::testing::TestWithParam<Param> {
 protected:
  // Groups g with rows[g] tokens, hidden H, expert width F, in one of the experts' three forms.
  enum class Form { forward, dgrad, wgrad };
  void check(Form form) {
    const auto& [platform, dtype] = GetParam();
    const Device dev = test::device_for(platform);
    const auto& ops = test::ops_on(platform);
    const std::vector<int64_t> rows = {5, 0, 17, 3, 1};
    const int64_t H = 24, F = 10;
    GemmArgs g;
    if (form == Form::forward) g.trans_b = true;
    if (form == Form::wgrad) {
      g.trans_a = true;
      g.beta = 1.0f;
    }
    const DType c_dtype = form == Form::wgrad ? DType::f32 : dtype;
    std::vector<test::TestTensor> as, bs, cs, cs_loop;
    std::vector<std::vector<double>> expect;
    uint64_t seed = 100 + static_cast<uint64_t>(form) * 10;
    for (const int64_t r : rows) {
      // forward: [r, H] x [F, H]^T; dgrad: [r, F] x [F, H]; wgrad: [r, F]^T x [r, H] into [F, H].
      const int64_t m = form == Form::wgrad ? F : r, n = form == Form::forward ? F : H;
      const int64_t k = form == Form::forward ? H : (form == Form::dgrad ? F : r);
      const Shape sa = form == Form::wgrad ? Shape{r, F} : Shape{r, k};
      const Shape sb =
          form == Form::forward ? Shape{F, H} : (form == Form::dgrad ? Shape{F, H} : Shape{r, H});
      as.push_back(make_tensor(random_values(shape_numel(sa), seed++), sa, dtype, dev));
      bs.push_back(make_tensor(random_values(shape_numel(sb), seed++), sb, dtype, dev));
      const auto c0 = random_values(static_cast<std::size_t>(m * n), seed++);
      cs.push_back(make_tensor(c0, {m, n}, c_dtype, dev));
      cs_loop.push_back(make_tensor(c0, {m, n}, c_dtype, dev));
      expect.push_back(
          ref_gemm(as.back().rounded, bs.back().rounded, cs.back().rounded, m, n, k, g));
    }
    std::vector<Tensor> c, a, b;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      c.push_back(cs[i].t);
      a.push_back(as[i].t);
      b.push_back(bs[i].t);
    }
    ops.grouped_gemm(c, a, b, g);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(all_close(to_doubles(cs[i].t), expect[i], tolerance(c_dtype)))
          << "group " << i << " rows " << rows[i] << " form " << static_cast<int>(form);
      ops.gemm(cs_loop[i].t, a[i], b[i], g);
    }
    if (platform != "cpu") return;
    // The CPU kernel is the loop of gemm calls: the same bits.
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Tensor x = cs[i].t.to(Device::cpu()), y = cs_loop[i].t.to(Device::cpu());
      ASSERT_EQ(x.numel(), y.numel());
      EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(),
                            static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype())),
                0)
          << "group " << i << " differs from gemm";
    }
  }
};

TEST_P(GroupedGemmTest, ForwardMatchesReferenceAndGemmLoop) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  check(Form::forward);
}

TEST_P(GroupedGemmTest, DgradMatchesReferenceAndGemmLoop) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  check(Form::dgrad);
}

TEST_P(GroupedGemmTest, WgradAccumulatesIntoF32LikeGemm) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  check(Form::wgrad);
}

MG_INSTANTIATE_OP_TEST(GroupedGemmTest);

TEST(GroupedGemmValidation, RejectsMismatchedGroups) {
  const auto& ops = test::ops_on("cpu");
  auto t = [](const Shape& s, DType d = DType::f32) { return Tensor::zeros(s, d, Device::cpu()); };
  std::vector<Tensor> c = {t({2, 3})}, a = {t({2, 4})}, b = {t({4, 3})}, none;
  EXPECT_NE(test::error_message([&] {
              ops.grouped_gemm(c, a, none, GemmArgs{});
            }).find("grouped_gemm: 1 C, 1 A and 0 B tensors"),
            std::string::npos);
  std::vector<Tensor> c2 = {t({2, 3}), t({2, 3})}, a2 = {t({2, 4}), t({2, 4}, DType::bf16)},
                      b2 = {t({4, 3}), t({4, 3}, DType::bf16)};
  EXPECT_NE(test::error_message([&] {
              ops.grouped_gemm(c2, a2, b2, GemmArgs{});
            }).find("grouped_gemm: group 1 has A bf16"),
            std::string::npos);
  std::vector<Tensor> c3 = {t({1, 2, 3})}, a3 = {t({1, 2, 4})}, b3 = {t({1, 4, 3})};
  EXPECT_NE(
      test::error_message([&] { ops.grouped_gemm(c3, a3, b3, GemmArgs{}); }).find("must be rank 2"),
      std::string::npos);
  std::vector<Tensor> c4 = {t({2, 3})}, a4 = {t({2, 5})}, b4 = {t({4, 3})};
  EXPECT_NE(test::error_message([&] {
              ops.grouped_gemm(c4, a4, b4, GemmArgs{});
            }).find("inner dims differ"),
            std::string::npos);
}

}  // namespace
}  // namespace mg
