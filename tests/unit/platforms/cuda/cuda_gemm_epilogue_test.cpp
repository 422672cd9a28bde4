// The CUDA gemm_epilogue against the CPU definition (megatron/platforms/cpu/gemm.cpp): every
// epilogue and dtype on shapes cuBLASLt's fused epilogues accept (multiples of 8, aligned) and on
// shapes that must take the unfused fallback (N % 8 != 0 for the aux epilogues, f64, K = 0, a bias
// of another dtype than C); the fused/fallback choice and the plan cache seen through
// gemm_plan_cache_stats (cuda_kernels.h, looked up by its C name so that this file also builds
// without CUDA). Every test skips without a GPU.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "megatron/platforms/cuda/cuda_kernels.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::GemmArgs;
using ops::GemmEpilogue;
using ops::GemmEpilogueArgs;
using platforms::cuda::GemmPlanCacheStats;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;

const Device kGpu = Device::cuda(0);

// The stats hook of the loaded CUDA platform, or null (a build without CUDA).
GemmPlanCacheStats (*stats_fn())() {
  return reinterpret_cast<GemmPlanCacheStats (*)()>(
      dlsym(RTLD_DEFAULT, "mg_cuda_gemm_plan_cache_stats"));
}

#define MG_SKIP_WITHOUT_GPU_GEMM()                                                       \
  do {                                                                                   \
    MG_SKIP_IF_UNAVAILABLE("cuda");                                                      \
    if (!stats_fn()) GTEST_SKIP() << "mg_cuda_gemm_plan_cache_stats not in the process"; \
  } while (0)

test::Tol tol_for(DType t, double factor = 2) {
  const auto tl = test::tolerance(t);
  return {tl.atol * factor, tl.rtol * factor};
}

// One gemm_epilogue call on the CPU and on the GPU with the same inputs; compares c, aux, dbias.
void compare(GemmEpilogue e, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype,
             DType c_dtype, bool with_bias, bool with_dbias, float beta, uint64_t seed,
             std::optional<DType> bias_dtype_opt = std::nullopt) {
  const DType bias_dtype = bias_dtype_opt.value_or(c_dtype);
  const auto& cpu = test::ops_on("cpu");
  const auto& gpu = test::ops_on("cuda");
  const GemmEpilogueArgs g{.trans_a = ta, .trans_b = tb, .epilogue = e, .beta = beta};
  const DType grad = dtype == DType::f64 ? DType::f64 : DType::f32;
  auto host = [&](std::vector<double> v, const Shape& s, DType d) {
    return make_tensor(v, s, d, Device::cpu()).t;
  };
  const Tensor a = host(random_values(static_cast<std::size_t>(m * k), seed),
                        ta ? Shape{k, m} : Shape{m, k}, dtype);
  const Tensor b = host(random_values(static_cast<std::size_t>(k * n), seed + 1),
                        tb ? Shape{n, k} : Shape{k, n}, dtype);
  Tensor c = host(random_values(static_cast<std::size_t>(m * n), seed + 2), {m, n}, c_dtype);
  Tensor bias, aux, dbias;
  if (with_bias) bias = host(random_values(static_cast<std::size_t>(n), seed + 3), {n}, bias_dtype);
  if (e == GemmEpilogue::dgelu_bgrad)
    aux = host(random_values(static_cast<std::size_t>(m * n), seed + 4, 0.1, 3.0), {m, n}, c_dtype);
  if (e == GemmEpilogue::bias_gelu) aux = Tensor::zeros({m, n}, c_dtype);
  const int64_t dlen = e == GemmEpilogue::bgrad ? m : n;
  if (with_dbias)
    dbias = host(random_values(static_cast<std::size_t>(dlen), seed + 5), {dlen}, grad);
  auto to_gpu = [&](const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); };
  Tensor cg = to_gpu(c), auxg = to_gpu(aux), dbg = to_gpu(dbias);
  const Tensor ag = to_gpu(a), bg = to_gpu(b), biasg = to_gpu(bias);
  cpu.gemm_epilogue(c, aux, dbias, a, b, bias, g);
  gpu.gemm_epilogue(cg, auxg, dbg, ag, bg, biasg, g);
  const std::string what = std::string(ops::gemm_epilogue_name(e)) + " m " + std::to_string(m) +
                           " n " + std::to_string(n) + " k " + std::to_string(k) + " ta " +
                           std::to_string(ta) + " tb " + std::to_string(tb) + " A " +
                           std::string(dtype_name(dtype)) + " C " +
                           std::string(dtype_name(c_dtype));
  EXPECT_TRUE(all_close(to_doubles(cg.to(Device::cpu())), to_doubles(c), tol_for(c_dtype))) << what;
  if (aux.defined()) {
    EXPECT_TRUE(all_close(to_doubles(auxg.to(Device::cpu())), to_doubles(aux), tol_for(c_dtype)))
        << what << " (aux)";
  }
  const bool c16 = c_dtype == DType::bf16 || c_dtype == DType::f16;
  if (dbias.defined() && e == GemmEpilogue::dgelu_bgrad && c16) {
    // The GPU sums, in f64, the g it wrote into c (rounded to C's dtype), the CPU the unrounded g
    // (gemm.cu epilogue_fused). Per column j: |gpu - cpu| <= sum_r |cg_rj - c_rj| (cuBLASLt's GELU
    // gradient against ours, bounded by the c check above) + u_C (1 + u_C) sum_r |c_rj| (c = g
    // rounded once) + m 2^-24 sum_r |cg_rj| (the CPU's f32 sums; the GPU's are f64) + 2^-23
    // |dbias_j| (the += on each side).
    const double u = c_dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const auto gc = to_doubles(cg.to(Device::cpu())), cc = to_doubles(c);
    const auto gd = to_doubles(dbg.to(Device::cpu())), cd = to_doubles(dbias);
    int bad = 0;
    double worst = 0;
    for (int64_t j = 0; j < n; ++j) {
      double diff_sum = 0, abs_sum = 0, gabs_sum = 0;
      for (int64_t r = 0; r < m; ++r) {
        const auto i = static_cast<std::size_t>(r * n + j);
        diff_sum += std::fabs(gc[i] - cc[i]);
        abs_sum += std::fabs(cc[i]);
        gabs_sum += std::fabs(gc[i]);
      }
      const auto jj = static_cast<std::size_t>(j);
      const double bound = diff_sum + u * (1 + u) * abs_sum +
                           static_cast<double>(m) * std::ldexp(1.0, -24) * gabs_sum +
                           std::ldexp(1.0, -23) * std::fabs(cd[jj]) + 1e-30;
      const double err = std::fabs(gd[jj] - cd[jj]);
      worst = std::max(worst, err / bound);
      if (!(err <= bound)) ++bad;
    }
    EXPECT_EQ(bad, 0) << what << " (dbias; worst error / bound " << worst << ")";
  } else if (dbias.defined()) {
    // cuBLASLt may write the bias gradient in C's dtype (when it has no f32 bias-gradient
    // algorithm): allow that rounding.
    const test::Tol t = tol_for(c_dtype == DType::f64 ? DType::f64 : c_dtype, 4);
    EXPECT_TRUE(all_close(to_doubles(dbg.to(Device::cpu())), to_doubles(dbias), t))
        << what << " (dbias)";
  }
}

class CudaGemmEpilogue : public ::testing::TestWithParam<DType> {};

TEST_P(CudaGemmEpilogue, EveryEpilogueMatchesCpuOnAlignedShapes) {
  MG_SKIP_WITHOUT_GPU_GEMM();
  const DType dt = GetParam();
  const DType grad = dt == DType::f64 ? DType::f64 : DType::f32;
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      compare(GemmEpilogue::bias, 64, 96, 48, ta, tb, dt, dt, true, false, 0, seed++);
      compare(GemmEpilogue::bias_gelu, 64, 96, 48, ta, tb, dt, dt, true, false, 0, seed++);
      compare(GemmEpilogue::bias_gelu, 32, 40, 24, ta, tb, dt, dt, false, false, 0, seed++);
      compare(GemmEpilogue::dgelu_bgrad, 64, 96, 48, ta, tb, dt, dt, false, true, 0, seed++);
      compare(GemmEpilogue::dgelu_bgrad, 64, 96, 48, ta, tb, dt, dt, false, false, 0, seed++);
      compare(GemmEpilogue::bgrad, 96, 64, 128, ta, tb, dt, grad, false, true, 1, seed++);
      compare(GemmEpilogue::bgrad, 96, 64, 128, ta, tb, dt, dt, false, true, 0, seed++);
    }
  // The shapes of a GPT-2 MLP slice (fc1 forward, fc2 data gradient, weight gradient).
  compare(GemmEpilogue::bias_gelu, 256, 3072, 768, false, true, dt, dt, true, false, 0, 90);
  compare(GemmEpilogue::dgelu_bgrad, 256, 3072, 768, false, false, dt, dt, false, true, 0, 91);
  compare(GemmEpilogue::bgrad, 3072, 768, 256, true, false, dt, grad, false, true, 1, 92);
}

// Shapes outside the epilogues' constraints take the unfused sequence: same results.
TEST_P(CudaGemmEpilogue, FallbackShapesMatchCpu) {
  MG_SKIP_WITHOUT_GPU_GEMM();
  const DType dt = GetParam();
  const DType grad = dt == DType::f64 ? DType::f64 : DType::f32;
  const GemmPlanCacheStats before = stats_fn()();
  compare(GemmEpilogue::bias_gelu, 9, 13, 7, false, true, dt, dt, true, false, 0, 20);  // N % 8
  compare(GemmEpilogue::dgelu_bgrad, 11, 13, 5, false, false, dt, dt, false, true, 0, 21);
  compare(GemmEpilogue::bias, 7, 13, 0, false, true, dt, dt, true, false, 0, 22);  // K = 0
  compare(GemmEpilogue::bgrad, 13, 7, 0, true, false, dt, grad, false, true, 1, 23);
  if (dt != DType::f32)  // a bias of another dtype than C
    compare(GemmEpilogue::bias, 16, 32, 8, false, true, dt, dt, true, false, 0, 24, DType::f32);
  const GemmPlanCacheStats after = stats_fn()();
  EXPECT_GE(after.unfused - before.unfused, 4u) << "the fallback shapes must take the unfused path";
}

TEST_P(CudaGemmEpilogue, MixedOutputDtypes) {
  MG_SKIP_WITHOUT_GPU_GEMM();
  const DType dt = GetParam();
  if (dt == DType::f64) GTEST_SKIP() << "f64 has no other C dtype";
  compare(GemmEpilogue::bias, 64, 96, 48, false, true, dt, DType::f32, true, false, 0, 30);
  compare(GemmEpilogue::bias_gelu, 64, 96, 48, false, true, dt, DType::f32, true, false, 0, 31);
  compare(GemmEpilogue::dgelu_bgrad, 64, 96, 48, false, false, dt, DType::f32, false, true, 0, 32);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaGemmEpilogue, ::testing::ValuesIn(test::kKernelDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// The bias and bias-GELU epilogues run fused in cuBLASLt on an aligned bf16 problem.
TEST(CudaGemmEpilogueFusion, AlignedBf16BiasEpiloguesRunFused) {
  MG_SKIP_WITHOUT_GPU_GEMM();
  const GemmPlanCacheStats before = stats_fn()();
  compare(GemmEpilogue::bias, 128, 256, 64, false, true, DType::bf16, DType::bf16, true, false, 0,
          40);
  compare(GemmEpilogue::bias_gelu, 128, 256, 64, false, true, DType::bf16, DType::bf16, true, false,
          0, 41);
  const GemmPlanCacheStats after = stats_fn()();
  EXPECT_EQ(after.fused - before.fused, 2u);
  EXPECT_EQ(after.unfused - before.unfused, 0u);
  // Not required (cuBLASLt versions differ), reported: do the gradient epilogues fuse?
  const GemmPlanCacheStats b2 = stats_fn()();
  compare(GemmEpilogue::dgelu_bgrad, 128, 256, 64, false, false, DType::bf16, DType::bf16, false,
          true, 0, 42);
  compare(GemmEpilogue::bgrad, 256, 64, 128, true, false, DType::bf16, DType::f32, false, true, 1,
          43);
  const GemmPlanCacheStats a2 = stats_fn()();
  std::printf("gradient epilogues: %llu fused, %llu unfused\n",
              static_cast<unsigned long long>(a2.fused - b2.fused),
              static_cast<unsigned long long>(a2.unfused - b2.unfused));
}

// The same problem twice: the second call finds the plan (a hit, no miss).
TEST(CudaGemmPlanCache, SameShapeTwiceHitsTheCache) {
  MG_SKIP_WITHOUT_GPU_GEMM();
  const auto& gpu = test::ops_on("cuda");
  Tensor a = make_tensor(random_values(72 * 40, 50), {72, 40}, DType::bf16, kGpu).t;
  Tensor b = make_tensor(random_values(40 * 56, 51), {40, 56}, DType::bf16, kGpu).t;
  Tensor c = Tensor::zeros({72, 56}, DType::bf16, kGpu);
  gpu.gemm(c, a, b, GemmArgs{});  // builds the plan (or finds it from an earlier test)
  const GemmPlanCacheStats s1 = stats_fn()();
  gpu.gemm(c, a, b, GemmArgs{});
  const GemmPlanCacheStats s2 = stats_fn()();
  EXPECT_EQ(s2.misses, s1.misses);
  EXPECT_EQ(s2.hits, s1.hits + 1);
  EXPECT_GE(s2.plans, 1u);
  // A new shape is a miss, then a hit.
  Tensor a2 = make_tensor(random_values(24 * 40, 52), {24, 40}, DType::bf16, kGpu).t;
  Tensor c2 = Tensor::zeros({24, 56}, DType::bf16, kGpu);
  gpu.gemm(c2, a2, b, GemmArgs{});
  const GemmPlanCacheStats s3 = stats_fn()();
  EXPECT_EQ(s3.misses, s2.misses + 1);
  gpu.gemm(c2, a2, b, GemmArgs{});
  EXPECT_EQ(stats_fn()().hits, s3.hits + 1);
}

}  // namespace
}  // namespace mg
