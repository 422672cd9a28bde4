// The CUDA FP8 kernels (platforms/cuda/fp8.cu) against the CPU emulation (platforms/cpu/fp8.cpp):
//   - fp8_cast_transpose: q, qt and amax bit for bit (the same dtype_math.h conversion; max is
//     exact), E4M3 and E5M2, shapes that are not multiples of the 32 x 32 tile.
//   - fp8_gemm (cuBLASLt, TN): within the derived bound. Both sides sum exact products of FP8
//     values; the CPU in f32 (unit roundoff 2^-24), Hopper's FP8 tensor cores with at least a
//     14-bit significand between f32 promotions (DeepSeek-V3 report, sec. 3.3.2; unit 2^-13, taken
//     as truncation). So |gpu - cpu| <= s (gamma_K(2^-24) + gamma_K(2^-13)) sum_k |a_k b_k| + one
//     rounding of C's dtype on each side (2 u_C |c|) + the f32 rounding of s (2^-24 s sum |ab|),
//     gamma_K(u) = K u / (1 - K u).
//   - on a GPU other than sm_89 / sm_90 fp8_gemm throws naming the device's compute capability.
// Every test skips without a GPU (printing the platform's reason). UNVERIFIED: never run on a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "megatron/core/tensor/dtype_math.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

const Device kGpu = Device::cuda(0);

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.raw_data());
  return std::vector<uint8_t>(p, p + h.numel());
}

TEST(CudaFp8, CastTransposeEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  for (DType qd : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType xd : {DType::f32, DType::bf16})
      for (auto [r, c] : {std::pair<int64_t, int64_t>{70, 45}, {32, 32}, {1, 300}}) {
        const auto v = test::random_values(static_cast<std::size_t>(r * c), 5, -900.0, 900.0);
        const Tensor x = Tensor::from_vector(v, {r, c}, xd);
        const Tensor scale = Tensor::from_vector(std::vector<float>{0.731f}, {1});
        Tensor q = Tensor::empty({r, c}, qd), qt = Tensor::empty({c, r}, qd);
        Tensor amax = Tensor::from_vector(std::vector<float>{1.0f}, {1});
        cpu.fp8_cast_transpose(q, qt, amax, x, scale);
        Tensor gq = Tensor::empty({r, c}, qd, kGpu), gqt = Tensor::empty({c, r}, qd, kGpu);
        Tensor gamax = amax.to(kGpu);
        gamax.copy_(Tensor::from_vector(std::vector<float>{1.0f}, {1}));
        gpu.fp8_cast_transpose(gq, gqt, gamax, x.to(kGpu), scale.to(kGpu));
        EXPECT_EQ(bytes_of(gq), bytes_of(q)) << dtype_name(qd) << " " << r << "x" << c;
        EXPECT_EQ(bytes_of(gqt), bytes_of(qt)) << dtype_name(qd) << " " << r << "x" << c;
        EXPECT_EQ(gamax.to(Device::cpu()).data<float>()[0], amax.data<float>()[0]);
      }
}

TEST(CudaFp8, GemmWithinTheDerivedBound) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const int64_t m = 64, n = 96, k = 256;
  for (auto [ta, tb] :
       {std::pair{DType::fp8_e4m3, DType::fp8_e4m3}, std::pair{DType::fp8_e5m2, DType::fp8_e4m3}})
    for (DType cd : {DType::f32, DType::bf16})
      for (float beta : {0.0f, 1.0f}) {
        if (cd != DType::f32 && beta != 0.0f) continue;
        const Tensor a = Tensor::from_vector(
            test::random_values(static_cast<std::size_t>(m * k), 21, -400.0, 400.0), {m, k}, ta);
        const Tensor b = Tensor::from_vector(
            test::random_values(static_cast<std::size_t>(n * k), 22, -400.0, 400.0), {n, k}, tb);
        const Tensor sa = Tensor::from_vector(std::vector<float>{0.013f}, {1});
        const Tensor sb = Tensor::from_vector(std::vector<float>{0.2f}, {1});
        const Tensor c0 = Tensor::from_vector(
            test::random_values(static_cast<std::size_t>(m * n), 23, -1.0, 1.0), {m, n}, cd);
        Tensor c = c0.clone();
        Tensor gc = c0.to(kGpu);
        try {
          gpu.fp8_gemm(gc, a.to(kGpu), b.to(kGpu), sa.to(kGpu), sb.to(kGpu), {.beta = beta});
        } catch (const Error& e) {
          const std::string what = e.what();
          ASSERT_NE(what.find("compute capability"), std::string::npos) << what;
          GTEST_SKIP() << "not an sm_89 / sm_90 GPU: " << what;
        }
        cpu.fp8_gemm(c, a, b, sa, sb, {.beta = beta});
        const auto gv = gc.to(Device::cpu()).to(DType::f64).to_vector<double>();
        const auto cv = c.to(DType::f64).to_vector<double>();
        const auto ad = a.to(DType::f64).to_vector<double>(),
                   bd = b.to(DType::f64).to_vector<double>();
        const double s = 0.013 * 0.2,
                     uc = cd == DType::f32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
        auto gamma = [&](double u) { return k * u / (1 - k * u); };
        int bad = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double abs_sum = 0;
            for (int64_t q = 0; q < k; ++q) abs_sum += std::fabs(ad[i * k + q] * bd[j * k + q]);
            const double bound = s *
                                     (gamma(std::ldexp(1.0, -24)) + gamma(std::ldexp(1.0, -13)) +
                                      std::ldexp(1.0, -24)) *
                                     abs_sum +
                                 2 * uc * std::fabs(cv[i * n + j]);
            bad += std::fabs(gv[i * n + j] - cv[i * n + j]) > bound;
          }
        EXPECT_EQ(bad, 0) << dtype_name(ta) << " x " << dtype_name(tb) << " -> " << dtype_name(cd)
                          << " beta " << beta;
      }
}

}  // namespace
}  // namespace mg
