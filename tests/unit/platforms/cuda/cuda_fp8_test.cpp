// The CUDA FP8 kernels (platforms/cuda/fp8.cu) against the CPU emulation (platforms/cpu/fp8.cpp):
//   - fp8_cast_transpose: q, qt and amax bit for bit (the same dtype_math.h conversion; max is
//     exact), E4M3 and E5M2, shapes that are not multiples of the 32 x 32 tile; f32 x (the scalar
//     kernel) and bf16 / f16 x, also with rows and cols multiples of 8 that are not multiples of
//     the vector kernel's 64 x 64 tile, and with q or qt alone.
//   - fp8_gemm (cuBLASLt, TN): within the derived bound. Both sides sum exact products of FP8
//     values; the CPU in f32 (unit roundoff 2^-24), Hopper's FP8 tensor cores with at least a
//     14-bit significand between f32 promotions (DeepSeek-V3 report, sec. 3.3.2; unit 2^-13, taken
//     as truncation). So |gpu - cpu| <= s (gamma_K(2^-24) + gamma_K(2^-13)) sum_k |a_k b_k| + one
//     rounding of C's dtype on each side (2 u_C |c|) + the f32 rounding of s (2^-24 s sum |ab|),
//     gamma_K(u) = K u / (1 - K u). With FAST_ACCUM (the forward GEMM, as TE's fprop) the partial
//     sums are never promoted: the 14-bit accumulation over all K terms, the same gamma_K(2^-13)
//     term, so the same bound.
//   - on a GPU other than sm_89 / sm_90 fp8_gemm throws naming the device's compute capability.
//   - the one-pass cast-transpose's amax (atomicMax on the bit patterns): keeps a larger earlier
//     amax, takes a NaN.
//   - fp8_scale_update: history, scale and scale_inv bit for bit against the CPU (the same
//     fp8_math.h code; zeros, NaN, Inf, overflowing quotients), delayed and current.
//   - the FP8 plan cache: a repeated problem is a hit and gives the same bytes, a new shape a miss;
//     the cached descriptor takes each call's scale pointers (a scale doubled doubles C exactly).
//   - the vector kernel's hardware conversion on edge values (zeros, ties, subnormals, saturation,
//     Inf, NaN) bit for bit, but for a NaN's sign (the GPU's multiply returns the canonical NaN).
//   - SwiGLU fused into the cast (fp8_swiglu_cast_transpose / fp8_dswiglu_cast_transpose): q, qt
//     and amax bit for bit against the GPU's own swiglu_fwd / swiglu_bwd followed by
//     fp8_cast_transpose (the fused kernel must round the operand to x's dtype exactly as the
//     separate op stores it), bf16 and f16, E4M3 and E5M2, shapes of the vector kernel (multiples
//     of 8, not of its 64 x 64 tile) and of the fallback (odd F), q or qt alone, the amax-only
//     pass of tensorwise scaling.
//   - fp8_norm_cast_transpose: q, qt, amax, statistics and sum bit for bit against the GPU's norm
//     op followed by fp8_cast_transpose (LayerNorm, RMSNorm, with the bias-dropout-add; the
//     vector kernel's dtypes and f32's generic pair).
//   - fp8_gemm with an FP8 C: each byte between the casts of the CPU's f32 result +- the bound
//     above (monotone RNE, saturation included), the amax within it; fp8_transpose bit for bit.
// Every test skips without a GPU (printing the platform's reason). All passed on an H200
// (2026-11-26 09:19 UTC, the hardware conversion included) except the edge-value test's first
// form, which compared a negative NaN's sign bit too (now cleared on both sides: UNVERIFIED).
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/tensor/dtype_math.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

const Device kGpu = Device::cuda(0);

// fp8.cu's plan cache counters (looked up by their C name: this file also builds without CUDA).
platforms::cuda::Fp8GemmPlanCacheStats fp8_plan_stats() {
  using Fn = platforms::cuda::Fp8GemmPlanCacheStats (*)();
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "mg_cuda_fp8_gemm_plan_cache_stats"));
  MG_CHECK(fn != nullptr, "mg_cuda_fp8_gemm_plan_cache_stats is not in the process");
  return fn();
}

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
    for (DType xd : {DType::f32, DType::bf16, DType::f16})
      for (auto [r, c] : {std::pair<int64_t, int64_t>{70, 45},
                          {32, 32},
                          {1, 300},
                          {136, 200},
                          {128, 256},
                          {8, 8}}) {
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

// The bytes with a NaN's sign bit cleared: the GPU's f32 multiply (x * scale) returns the canonical
// NaN, so a NaN input's sign is not kept there (the CPU keeps it); every other byte must be equal.
std::vector<uint8_t> nan_sign_cleared(std::vector<uint8_t> b, DType qd) {
  for (uint8_t& x : b) {
    const bool nan = qd == DType::fp8_e4m3 ? (x & 0x7f) == 0x7f : (x & 0x7c) == 0x7c && (x & 3);
    if (nan) x &= 0x7f;
  }
  return b;
}

// The vector kernel's conversion (the hardware's cvt.rn.satfinite on sm_89+) on the values where
// encoders differ: signed zeros, ties to even, the subnormal range and its underflow, the largest
// finite values and just above (saturation), Inf and NaN of both signs, for E4M3 and E5M2. On an
// H200 (2026-11-26) every byte matched except a negative NaN's sign (see nan_sign_cleared).
TEST(CudaFp8, CastTransposeEdgeValuesEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::vector<float> edge = {0.0f,
                             -0.0f,
                             1.0625f,
                             1.1875f,
                             -1.0625f,
                             0.0009765625f,
                             0.001953125f,
                             0.0029296875f,
                             0.00048828125f,
                             1e-30f,
                             -1e-30f,
                             240.0f,
                             448.0f,
                             464.0f,
                             480.0f,
                             -500.0f,
                             57344.0f,
                             61440.0f,
                             65536.0f,
                             -1e9f,
                             inf,
                             -inf,
                             nan,
                             -nan,
                             3.0517578125e-05f,
                             1.52587890625e-05f,
                             6.103515625e-05f};
  const int64_t r = 16, c = 64;
  std::vector<float> v(static_cast<std::size_t>(r * c));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = edge[i % edge.size()] * (i / edge.size() % 2 ? 0.5f : 1.0f);
  for (DType qd : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType xd : {DType::bf16, DType::f16}) {
      const Tensor x = Tensor::from_vector(v, {r, c}).to(Device::cpu());
      Tensor xc = Tensor::empty({r, c}, xd);
      xc.copy_(x);
      const Tensor scale = Tensor::from_vector(std::vector<float>{1.0f}, {1});
      Tensor q = Tensor::empty({r, c}, qd), qt = Tensor::empty({c, r}, qd);
      Tensor amax = Tensor::from_vector(std::vector<float>{0.0f}, {1});
      cpu.fp8_cast_transpose(q, qt, amax, xc, scale);
      Tensor gq = Tensor::empty({r, c}, qd, kGpu), gqt = Tensor::empty({c, r}, qd, kGpu);
      Tensor gamax = Tensor::from_vector(std::vector<float>{0.0f}, {1}).to(kGpu);
      gpu.fp8_cast_transpose(gq, gqt, gamax, xc.to(kGpu), scale.to(kGpu));
      EXPECT_EQ(nan_sign_cleared(bytes_of(gq), qd), nan_sign_cleared(bytes_of(q), qd))
          << dtype_name(qd) << " from " << dtype_name(xd);
      EXPECT_EQ(nan_sign_cleared(bytes_of(gqt), qd), nan_sign_cleared(bytes_of(qt), qd))
          << dtype_name(qd) << " from " << dtype_name(xd);
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
      for (float beta : {0.0f, 1.0f})
        for (bool fast : {false, true}) {  // fast: the forward's FAST_ACCUM (TE's fprop)
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
            gpu.fp8_gemm(gc, a.to(kGpu), b.to(kGpu), sa.to(kGpu), sb.to(kGpu),
                         {.beta = beta, .fast_accum = fast});
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
                            << " beta " << beta << " fast_accum " << fast;
        }
}

// An FP8 C (cuBLASLt's D scale and amax; --fp8-multi-head-attention's dO): the f32 results of
// the two sides differ by at most the bound above (B_ij, C's rounding term dropped: the FP8 cast
// reads the f32 result), and the RNE cast is monotone, so the GPU's byte lies between the casts
// of (v_cpu - B) so and (v_cpu + B) so, saturation included (a cuBLASLt that did not saturate
// would give NaN / Inf there); its amax is within the largest B of the CPU's.
TEST(CudaFp8, GemmFp8OutputWithinTheDerivedBound) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const int64_t m = 64, n = 96, k = 256;
  const Tensor a =
      Tensor::from_vector(test::random_values(static_cast<std::size_t>(m * k), 31, -400.0, 400.0),
                          {m, k}, DType::fp8_e5m2);
  const Tensor b =
      Tensor::from_vector(test::random_values(static_cast<std::size_t>(n * k), 32, -400.0, 400.0),
                          {n, k}, DType::fp8_e4m3);
  const Tensor sa = Tensor::from_vector(std::vector<float>{0.013f}, {1});
  const Tensor sb = Tensor::from_vector(std::vector<float>{0.2f}, {1});
  Tensor c32 = Tensor::zeros({m, n}, DType::f32);
  cpu.fp8_gemm(c32, a, b, sa, sb, {});
  const auto v = c32.to_vector<float>();
  float vmax = 0.0f;
  for (float x : v) vmax = std::max(vmax, std::fabs(x));
  const auto ad = a.to(DType::f64).to_vector<double>(), bd = b.to(DType::f64).to_vector<double>();
  const double s = 0.013 * 0.2;
  auto gamma = [&](double u) { return k * u / (1 - k * u); };
  for (DType out : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const bool e4m3 = out == DType::fp8_e4m3;
    const float so = 1.5f * fp8::fp8_max(out) / vmax;  // the largest third saturates
    const Tensor scale = Tensor::from_vector(std::vector<float>{so}, {1});
    Tensor gq = Tensor::zeros({m, n}, out).to(kGpu);
    Tensor gamax = Tensor::from_vector(std::vector<float>{0.0f}, {1}).to(kGpu);
    try {
      gpu.fp8_gemm(gq, a.to(kGpu), b.to(kGpu), sa.to(kGpu), sb.to(kGpu),
                   {.out_scale = scale.to(kGpu), .out_amax = gamax});
    } catch (const Error& e) {
      const std::string what = e.what();
      ASSERT_NE(what.find("compute capability"), std::string::npos) << what;
      GTEST_SKIP() << "not an sm_89 / sm_90 GPU: " << what;
    }
    const std::vector<uint8_t> g = bytes_of(gq);
    auto enc = [&](double x) {
      const float f = static_cast<float>(x) * so;
      return e4m3 ? dmath::f32_to_e4m3(f, true) : dmath::f32_to_e5m2(f, true);
    };
    auto dec = [&](uint8_t q) {
      return static_cast<double>(e4m3 ? dmath::e4m3_to_f32(q) : dmath::e5m2_to_f32(q));
    };
    int bad = 0;
    double worst_bound = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double abs_sum = 0;
        for (int64_t q = 0; q < k; ++q) abs_sum += std::fabs(ad[i * k + q] * bd[j * k + q]);
        const double bound =
            s * (gamma(std::ldexp(1.0, -24)) + gamma(std::ldexp(1.0, -13)) + std::ldexp(1.0, -24)) *
            abs_sum;
        worst_bound = std::max(worst_bound, bound);
        const double vc = v[static_cast<std::size_t>(i * n + j)];
        const double lo = dec(enc(vc - bound)), hi = dec(enc(vc + bound));
        const double got = dec(g[static_cast<std::size_t>(i * n + j)]);
        bad += !(got >= lo && got <= hi);  // NaN fails too
      }
    EXPECT_EQ(bad, 0) << dtype_name(out);
    const double amax_g = gamax.to(Device::cpu()).to_vector<float>()[0];
    EXPECT_NEAR(amax_g, vmax, worst_bound) << dtype_name(out);
  }
}

// fp8_transpose: the bytes of the CPU's, vector shapes (multiples of 8, not of the 64 x 64 tile
// too) and the byte kernel's.
TEST(CudaFp8, TransposeEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  for (auto [r, c] :
       {std::pair<int64_t, int64_t>{128, 256}, {136, 200}, {8, 8}, {70, 45}, {1, 300}}) {
    const Tensor q =
        Tensor::from_vector(test::random_values(static_cast<std::size_t>(r * c), 41, -400.0, 400.0),
                            {r, c}, DType::fp8_e4m3);
    Tensor qt = Tensor::zeros({c, r}, DType::fp8_e4m3);
    cpu.fp8_transpose(qt, q);
    Tensor gqt = Tensor::zeros({c, r}, DType::fp8_e4m3).to(kGpu);
    gpu.fp8_transpose(gqt, q.to(kGpu));
    EXPECT_EQ(bytes_of(gqt), bytes_of(qt)) << r << " x " << c;
  }
}

// fp8_norm_cast_transpose (the norm kernel writing its output in FP8, then fp8_transpose): q, qt,
// amax, the statistics and sum bit for bit against the GPU's own norm op followed by
// fp8_cast_transpose -- LayerNorm and RMSNorm, with and without the bias-dropout-add in front,
// bf16 and f16 rows the vector kernel takes (H 1024, 2048) and f32 (the generic pair), E4M3 and
// E5M2, q or qt alone.
TEST(CudaFp8, NormCastEqualsTheNormOpThenTheCast) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  int cases = 0;
  for (DType xd : {DType::bf16, DType::f16, DType::f32})
    for (int64_t h : {int64_t{1024}, int64_t{2048}})
      for (const bool ln : {true, false})
        for (const bool bda : {false, true})
          for (DType qd : {DType::fp8_e4m3, DType::fp8_e5m2}) {
            const int64_t r = 136;
            const auto on = [&](std::vector<double> v, Shape shape, DType t) {
              return Tensor::from_vector(v, shape, t).to(kGpu);
            };
            const Tensor x =
                on(test::random_values(static_cast<std::size_t>(r * h), 51, -3.0, 3.0), {r, h}, xd);
            const Tensor res =
                on(test::random_values(static_cast<std::size_t>(r * h), 52, -3.0, 3.0), {r, h}, xd);
            const Tensor g =
                on(test::random_values(static_cast<std::size_t>(h), 53, 0.5, 1.5), {h}, xd);
            const Tensor b =
                on(test::random_values(static_cast<std::size_t>(h), 54, -0.5, 0.5), {h}, xd);
            const Tensor scale = Tensor::from_vector(std::vector<float>{23.0f}, {1}).to(kGpu);
            const ops::NormKind kind = ln ? ops::NormKind::layernorm : ops::NormKind::rmsnorm;
            const ops::NormArgs args{.eps = 1e-5f};
            auto stats = [&] { return Tensor::empty({r}, DType::f32, kGpu); };
            Tensor y = Tensor::empty({r, h}, xd, kGpu), sum_ref, mean_ref, rstd_ref = stats();
            if (ln) mean_ref = stats();
            if (bda) {
              sum_ref = Tensor::empty({r, h}, xd, kGpu);
              gpu.bias_dropout_add_norm_fwd(y, sum_ref, mean_ref, rstd_ref, x, b, res, g,
                                            ln ? b : Tensor(), ops::DropoutArgs{}, args, kind);
            } else if (ln) {
              gpu.layernorm_fwd(y, mean_ref, rstd_ref, x, g, b, args);
            } else {
              gpu.rmsnorm_fwd(y, rstd_ref, x, g, args);
            }
            for (int form = 0; form < 3; ++form) {  // q and qt, q alone, qt alone
              Tensor q_ref = form != 2 ? Tensor::empty({r, h}, qd, kGpu) : Tensor();
              Tensor qt_ref = form != 1 ? Tensor::empty({h, r}, qd, kGpu) : Tensor();
              Tensor amax_ref = Tensor::from_vector(std::vector<float>{0.25f}, {1}).to(kGpu);
              gpu.fp8_cast_transpose(q_ref, qt_ref, amax_ref, y, scale);
              Tensor q = form != 2 ? Tensor::empty({r, h}, qd, kGpu) : Tensor();
              Tensor qt = form != 1 ? Tensor::empty({h, r}, qd, kGpu) : Tensor();
              Tensor amax = Tensor::from_vector(std::vector<float>{0.25f}, {1}).to(kGpu);
              Tensor sum = bda ? Tensor::empty({r, h}, xd, kGpu) : Tensor();
              Tensor mean = ln ? stats() : Tensor(), rstd = stats();
              gpu.fp8_norm_cast_transpose(q, qt, amax, sum, mean, rstd, x, bda ? b : Tensor(),
                                          bda ? res : Tensor(), g, ln ? b : Tensor(), scale,
                                          ops::DropoutArgs{}, args, kind);
              const std::string what = std::string(dtype_name(xd)) + " H " + std::to_string(h) +
                                       (ln ? " layernorm" : " rmsnorm") + (bda ? " + bda" : "") +
                                       " -> " + std::string(dtype_name(qd)) + " form " +
                                       std::to_string(form);
              if (q.defined()) {
                EXPECT_EQ(bytes_of(q), bytes_of(q_ref)) << what;
              }
              if (qt.defined()) {
                EXPECT_EQ(bytes_of(qt), bytes_of(qt_ref)) << what;
              }
              EXPECT_EQ(amax.to(Device::cpu()).to_vector<float>(),
                        amax_ref.to(Device::cpu()).to_vector<float>())
                  << what;
              EXPECT_EQ(bytes_of(rstd), bytes_of(rstd_ref)) << what;
              if (ln) {
                EXPECT_EQ(bytes_of(mean), bytes_of(mean_ref)) << what;
              }
              if (bda) {
                EXPECT_EQ(bytes_of(sum), bytes_of(sum_ref)) << what;
              }
              ++cases;
            }
          }
  EXPECT_EQ(cases, 3 * 2 * 2 * 2 * 2 * 3);
}

TEST(CudaFp8, CastTransposeOfQOrQtAloneEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const int64_t r = 72, c = 136;
  const auto v = test::random_values(static_cast<std::size_t>(r * c), 6, -300.0, 300.0);
  const Tensor x = Tensor::from_vector(v, {r, c}, DType::bf16);
  const Tensor scale = Tensor::from_vector(std::vector<float>{1.5f}, {1});
  for (bool want_q : {true, false}) {
    Tensor q, qt, gq, gqt;
    if (want_q) {
      q = Tensor::empty({r, c}, DType::fp8_e4m3);
      gq = Tensor::empty({r, c}, DType::fp8_e4m3, kGpu);
    } else {
      qt = Tensor::empty({c, r}, DType::fp8_e4m3);
      gqt = Tensor::empty({c, r}, DType::fp8_e4m3, kGpu);
    }
    Tensor amax = Tensor::from_vector(std::vector<float>{0.0f}, {1});
    Tensor gamax = amax.to(kGpu);
    cpu.fp8_cast_transpose(q, qt, amax, x, scale);
    gpu.fp8_cast_transpose(gq, gqt, gamax, x.to(kGpu), scale.to(kGpu));
    if (want_q)
      EXPECT_EQ(bytes_of(gq), bytes_of(q));
    else
      EXPECT_EQ(bytes_of(gqt), bytes_of(qt));
    EXPECT_EQ(gamax.to(Device::cpu()).data<float>()[0], amax.data<float>()[0]);
  }
}

TEST(CudaFp8, CastTransposeAmaxKeepsLargerAndTakesNaN) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  const Tensor scale = Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(kGpu);
  std::vector<float> v(64 * 40, 0.5f);
  v[777] = -3.0f;
  for (float prior : {1.0f, 7.0f}) {
    Tensor amax = Tensor::from_vector(std::vector<float>{prior}, {1}).to(kGpu);
    Tensor q = Tensor::empty({64, 40}, DType::fp8_e4m3, kGpu), none;
    gpu.fp8_cast_transpose(q, none, amax, Tensor::from_vector(v, {64, 40}).to(kGpu), scale);
    EXPECT_EQ(amax.to(Device::cpu()).data<float>()[0], std::max(prior, 3.0f));
  }
  v[1000] = std::nanf("");
  Tensor amax = Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(kGpu);
  Tensor none, none2;
  gpu.fp8_cast_transpose(none, none2, amax, Tensor::from_vector(v, {64, 40}).to(kGpu), scale);
  EXPECT_TRUE(std::isnan(amax.to(Device::cpu()).data<float>()[0]));
}

TEST(CudaFp8, ScaleUpdateEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const float special[] = {0.0f, std::nanf(""), INFINITY, 1e-30f, 3.0e38f, 448.0f, 0.02f};
  for (bool current : {false, true})
    for (int64_t len : {int64_t{1}, int64_t{3}, int64_t{16}})
      for (bool max_history : {false, true}) {
        if (current && len != 1) continue;
        const int64_t slots = 300;  // more than one block
        const auto r = test::random_values(static_cast<std::size_t>(len * slots), 41, 0.0, 900.0);
        std::vector<float> h(r.begin(), r.end());
        for (std::size_t i = 0; i < 7; ++i) h[i * 13] = special[i];
        const auto sr = test::random_values(static_cast<std::size_t>(slots), 42, 0.1, 4.0);
        std::vector<float> sc(sr.begin(), sr.end()), si(sc.size(), 0.0f);
        Tensor ch = Tensor::from_vector(h, {len, slots}), cs = Tensor::from_vector(sc, {slots}),
               csi = Tensor::from_vector(si, {slots});
        Tensor gh = ch.to(kGpu), gs = cs.to(kGpu), gsi = csi.to(kGpu);
        const ops::Fp8ScaleUpdateArgs args{
            .fp8_max = 448.0f, .margin = 1, .max_history = max_history, .current = current};
        cpu.fp8_scale_update(ch, cs, csi, args);
        gpu.fp8_scale_update(gh, gs, gsi, args);
        auto same_bits = [](const Tensor& a, const Tensor& b) {
          const auto x = a.to(Device::cpu()).to_vector<float>(), y = b.to_vector<float>();
          for (std::size_t i = 0; i < x.size(); ++i)
            if (std::bit_cast<uint32_t>(x[i]) != std::bit_cast<uint32_t>(y[i])) return false;
          return x.size() == y.size();
        };
        EXPECT_TRUE(same_bits(gh, ch)) << "history, len " << len << " current " << current;
        EXPECT_TRUE(same_bits(gs, cs)) << "scale, len " << len << " current " << current;
        EXPECT_TRUE(same_bits(gsi, csi)) << "scale_inv, len " << len << " current " << current;
      }
}

TEST(CudaFp8, GemmPlanCacheReusesPlansAndTakesEachCallsScales) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  auto fp8 = [](int64_t r, int64_t c, uint64_t seed) {
    return Tensor::from_vector(
               test::random_values(static_cast<std::size_t>(r * c), seed, -100.0, 100.0), {r, c},
               DType::fp8_e4m3)
        .to(kGpu);
  };
  const Tensor a = fp8(48, 64, 51), b = fp8(80, 64, 52);
  const Tensor s1 = Tensor::from_vector(std::vector<float>{0.37f}, {1}).to(kGpu);
  const Tensor s2 = Tensor::from_vector(std::vector<float>{2.0f * 0.37f}, {1}).to(kGpu);
  Tensor c1 = Tensor::zeros({48, 80}, DType::f32, kGpu);
  try {
    gpu.fp8_gemm(c1, a, b, s1, s1, {});
  } catch (const Error& e) {
    const std::string what = e.what();
    ASSERT_NE(what.find("compute capability"), std::string::npos) << what;
    GTEST_SKIP() << "not an sm_89 / sm_90 GPU: " << what;
  }
  const auto st0 = fp8_plan_stats();
  Tensor c2 = Tensor::zeros({48, 80}, DType::f32, kGpu);
  gpu.fp8_gemm(c2, a, b, s1, s1, {});
  const auto st1 = fp8_plan_stats();
  EXPECT_EQ(st1.misses, st0.misses);
  EXPECT_EQ(st1.hits, st0.hits + 1);
  EXPECT_EQ(st1.plans, st0.plans);
  const auto v1 = c1.to(Device::cpu()).to_vector<float>(),
             v2 = c2.to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(v1, v2);
  Tensor c3 = Tensor::zeros({48, 80}, DType::f32, kGpu);
  gpu.fp8_gemm(c3, a, b, s2, s1, {});  // same plan, a's scale doubled
  EXPECT_EQ(fp8_plan_stats().misses, st0.misses);
  const auto v3 = c3.to(Device::cpu()).to_vector<float>();
  for (std::size_t i = 0; i < v1.size(); ++i) ASSERT_EQ(v3[i], 2.0f * v1[i]) << i;
  Tensor c4 = Tensor::zeros({32, 80}, DType::f32, kGpu);
  gpu.fp8_gemm(c4, fp8(32, 64, 53), b, s1, s1, {});  // a new shape: a new plan
  const auto st4 = fp8_plan_stats();
  EXPECT_EQ(st4.misses, st0.misses + 1);
  EXPECT_EQ(st4.plans, st0.plans + 1);
}

TEST(CudaFp8, SwigluFusedCastsEqualTheSeparateOps) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  for (DType qd : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType xd : {DType::bf16, DType::f16})
      for (auto [r, f] :
           {std::pair<int64_t, int64_t>{128, 256}, {72, 200}, {8, 8}, {64, 5}, {40, 1024}}) {
        const std::string what = std::string(dtype_name(qd)) + " " + std::string(dtype_name(xd)) +
                                 " " + std::to_string(r) + "x" + std::to_string(f);
        const Tensor x = Tensor::from_vector(
            test::random_values(static_cast<std::size_t>(r * 2 * f), 9, 0.01, 8.0), {r, 2 * f}, xd,
            kGpu);
        const Tensor dy = Tensor::from_vector(
            test::random_values(static_cast<std::size_t>(r * f), 10, 0.01, 4.0), {r, f}, xd, kGpu);
        const Tensor scale = Tensor::from_vector(std::vector<float>{37.5f}, {1}, DType::f32, kGpu);
        Tensor y = Tensor::empty({r, f}, xd, kGpu), dx = Tensor::empty({r, 2 * f}, xd, kGpu);
        gpu.swiglu_fwd(y, x);
        gpu.swiglu_bwd(dx, dy, x);
        auto zero = [] { return Tensor::zeros({1}, DType::f32, kGpu); };
        for (int which = 0; which < 2; ++which) {  // 0: swiglu, 1: dswiglu
          const int64_t c = which == 0 ? f : 2 * f;
          Tensor q1 = Tensor::empty({r, c}, qd, kGpu), qt1 = Tensor::empty({c, r}, qd, kGpu);
          Tensor q2 = Tensor::empty({r, c}, qd, kGpu), qt2 = Tensor::empty({c, r}, qd, kGpu);
          Tensor a1 = zero(), a2 = zero(), a3 = zero(), a4 = zero();
          Tensor q4 = Tensor::empty({r, c}, qd, kGpu), none, none2;
          gpu.fp8_cast_transpose(q1, qt1, a1, which == 0 ? y : dx, scale);
          if (which == 0) {
            gpu.fp8_swiglu_cast_transpose(q2, qt2, a2, x, scale);
            gpu.fp8_swiglu_cast_transpose(none, none2, a3, x, scale);  // amax only
            gpu.fp8_swiglu_cast_transpose(q4, none2, a4, x, scale);    // q alone
          } else {
            gpu.fp8_dswiglu_cast_transpose(q2, qt2, a2, dy, x, scale);
            gpu.fp8_dswiglu_cast_transpose(none, none2, a3, dy, x, scale);
            gpu.fp8_dswiglu_cast_transpose(q4, none2, a4, dy, x, scale);
          }
          const std::string w = what + (which == 0 ? " swiglu" : " dswiglu");
          EXPECT_EQ(bytes_of(q2), bytes_of(q1)) << w;
          EXPECT_EQ(bytes_of(qt2), bytes_of(qt1)) << w;
          EXPECT_EQ(bytes_of(q4), bytes_of(q1)) << w;
          const float amax = a1.to(Device::cpu()).to_vector<float>()[0];
          EXPECT_GT(amax, 0.0f) << w;
          for (const Tensor* a : {&a2, &a3, &a4})
            EXPECT_EQ(std::bit_cast<uint32_t>(a->to(Device::cpu()).to_vector<float>()[0]),
                      std::bit_cast<uint32_t>(amax))
                << w;
        }
      }
}

}  // namespace
}  // namespace mg
