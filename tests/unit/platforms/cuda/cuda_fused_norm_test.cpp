// The CUDA fused residual-path norm ops (norm.cu: bias_dropout_add_norm_fwd, norm_bwd_add) against
// the CPU platform's (norm.cpp, bit-identical there to the unfused sequences): every dtype,
// LayerNorm and RMSNorm, bias and beta on/off, zero-centred gamma, dropout on/off, odd sizes (H =
// 1, primes, a row wider than a block, more rows than a 1-D grid holds), outputs poisoned with NaN,
// dx aliasing dy. The dropout mask must be the CPU's bit for bit: a dropped element's sum
// is exactly its residual. Every test skips without a GPU.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "megatron/core/random/philox.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::DropoutArgs;
using ops::NormArgs;
using ops::NormKind;
using test::make_tensor;
using test::random_values;
using test::to_doubles;

const Device kGpu = Device::cuda(0);
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const ops::OpTable& cpu_ops() {
  return test::ops_on("cpu");
}
const ops::OpTable& gpu_ops() {
  return test::ops_on("cuda");
}

DType stat_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

// The same values on the host and on the GPU (rounded to dtype once).
struct Pair {
  Tensor cpu, gpu;
};
Pair pair_of(const std::vector<double>& v, const Shape& shape, DType dtype) {
  auto h = make_tensor(v, shape, dtype, Device::cpu());
  return {h.t, h.t.to(kGpu)};
}
Pair random_pair(const Shape& shape, DType dtype, uint64_t seed, double lo = 0.1, double hi = 1.0) {
  return pair_of(random_values(static_cast<std::size_t>(shape_numel(shape)), seed, lo, hi), shape,
                 dtype);
}
Pair nan_pair(const Shape& shape, DType dtype) {
  return pair_of(std::vector<double>(static_cast<std::size_t>(shape_numel(shape)), kNaN), shape,
                 dtype);
}

// CPU and GPU reduce in different orders: twice the dtype's tolerance.
test::Tol twice(DType t) {
  const auto tol = test::tolerance(t);
  return {2 * tol.atol, 2 * tol.rtol};
}

const char* kind_name(NormKind k) {
  return k == NormKind::layernorm ? "layernorm" : "rmsnorm";
}

// H = 1, primes, a row wider than a block (256 threads), more rows than grid x (65535).
// H a multiple of 8 (768, 2048, 40; 8192: two vectors per thread) takes norm.cu's vector paths
// for bf16 / f16; 8200 exceeds them (scalar kernels).
const std::vector<Shape> kShapes = {{7, 1},    {3, 7},     {3, 2, 13}, {37, 300},
                                    {5, 1031}, {65537, 2}, {37, 768},  {19, 2048},
                                    {3, 8192}, {41, 40},   {2, 8200}};

class CudaFusedNorm : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaFusedNorm, ForwardMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
      const bool ln = kind == NormKind::layernorm;
      for (bool with_bias : {true, false}) {
        for (float p : {0.0f, 0.3f}) {
          for (bool zc : {false, true}) {
            const bool with_beta = ln && !zc;  // beta on and off across the cases
            const std::string ctx = std::string(kind_name(kind)) + " " + shape_str(shape) + " " +
                                    std::string(dtype_name(dt)) + (with_bias ? " bias" : "") +
                                    (with_beta ? " beta" : "") + (zc ? " zero-centred" : "") +
                                    " p=" + std::to_string(p);
            NormArgs args;
            args.zero_centered_gamma = zc;
            const DropoutArgs d{p, 4242, 1001};  // offset not on a Philox block boundary
            auto x = random_pair(shape, dt, 1 + h, 0.1, 2.0);
            auto res = random_pair(shape, dt, 2 + h, 0.1, 2.0);
            auto bias = random_pair({h}, dt, 3 + h);
            auto gamma = random_pair({h}, dt, 4 + h);
            auto beta = random_pair({h}, dt, 5 + h);
            auto y = nan_pair(shape, dt), sum = nan_pair(shape, dt);
            auto mean = nan_pair({rows}, stat_dtype(dt)), rstd = nan_pair({rows}, stat_dtype(dt));
            Tensor mc = ln ? mean.cpu : Tensor(), mg = ln ? mean.gpu : Tensor();
            cpu_ops().bias_dropout_add_norm_fwd(y.cpu, sum.cpu, mc, rstd.cpu, x.cpu,
                                                with_bias ? bias.cpu : Tensor(), res.cpu, gamma.cpu,
                                                with_beta ? beta.cpu : Tensor(), d, args, kind);
            gpu_ops().bias_dropout_add_norm_fwd(y.gpu, sum.gpu, mg, rstd.gpu, x.gpu,
                                                with_bias ? bias.gpu : Tensor(), res.gpu, gamma.gpu,
                                                with_beta ? beta.gpu : Tensor(), d, args, kind);
            const auto sum_g = to_doubles(sum.gpu), res_v = to_doubles(res.cpu);
            EXPECT_TRUE(test::all_close(sum_g, to_doubles(sum.cpu), twice(dt))) << ctx << ": sum";
            // y and the statistics are the norm of the STORED sum (norm.cu), so they are checked
            // against the CPU's norm of the GPU's own stored sum (residual = that sum, x = 0,
            // no dropout: the CPU's sum is then that sum exactly). Compared with the CPU's y
            // instead, a last-bit difference of one sum element (allowed above: the compilers
            // contract (x + bias) * scale + residual differently) is amplified without bound by
            // an ill-conditioned row: H = 2 with nearly equal sums, y = +-d / sqrt(d^2 / 4 + eps)
            // for d = s0 - s1 (f16, p = 0.3 on an H200: y off by 0.06, rstd by 8.7).
            const Tensor sum_h = sum.gpu.to(Device::cpu());
            Tensor yr = nan_pair(shape, dt).cpu, sr = nan_pair(shape, dt).cpu;
            Tensor mr = ln ? nan_pair({rows}, stat_dtype(dt)).cpu : Tensor();
            Tensor rr = nan_pair({rows}, stat_dtype(dt)).cpu;
            cpu_ops().bias_dropout_add_norm_fwd(yr, sr, mr, rr, Tensor::zeros(shape, dt), Tensor(),
                                                sum_h, gamma.cpu, with_beta ? beta.cpu : Tensor(),
                                                DropoutArgs{0.0f, 0, 0}, args, kind);
            ASSERT_EQ(to_doubles(sr), to_doubles(sum_h)) << ctx << ": the reference's sum";
            EXPECT_TRUE(test::all_close(to_doubles(y.gpu), to_doubles(yr), twice(dt)))
                << ctx << ": y";
            EXPECT_TRUE(
                test::all_close(to_doubles(rstd.gpu), to_doubles(rr), twice(stat_dtype(dt))))
                << ctx << ": rstd";
            if (ln) {
              EXPECT_TRUE(
                  test::all_close(to_doubles(mean.gpu), to_doubles(mr), twice(stat_dtype(dt))))
                  << ctx << ": mean";
            }
            // The mask: a dropped element's sum is exactly its residual.
            if (p > 0.0f) {
              int64_t dropped = 0, wrong = 0;
              for (int64_t i = 0; i < n; ++i)
                if (!random::dropout_keep(d.seed, d.offset + static_cast<uint64_t>(i), d.p)) {
                  ++dropped;
                  if (sum_g[static_cast<std::size_t>(i)] != res_v[static_cast<std::size_t>(i)])
                    ++wrong;
                }
              EXPECT_EQ(wrong, 0) << ctx << ": " << wrong << " of " << dropped
                                  << " dropped elements are not the residual";
            }
          }
        }
      }
    }
  }
}

TEST_P(CudaFusedNorm, BackwardAddMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
      const bool ln = kind == NormKind::layernorm;
      for (bool with_dres : {true, false}) {
        for (bool in_place : {false, true}) {  // dx aliasing dy
          for (bool zc : {false, true}) {
            const std::string ctx = std::string(kind_name(kind)) + " " + shape_str(shape) + " " +
                                    std::string(dtype_name(dt)) + (with_dres ? " dresidual" : "") +
                                    (in_place ? " dx = dy" : "") + (zc ? " zero-centred" : "");
            NormArgs args;
            args.zero_centered_gamma = zc;
            auto x = random_pair(shape, dt, 11 + h, 0.1, 2.0);
            auto dy = random_pair(shape, dt, 12 + h);
            Pair dy_copy = pair_of(to_doubles(dy.cpu), shape, dt);  // dy may be overwritten
            auto dres = random_pair(shape, dt, 13 + h);
            auto gamma = random_pair({h}, dt, 14 + h);
            // Statistics from the CPU forward, the same on both sides.
            Tensor y = Tensor::empty(shape, dt);
            Tensor mean = ln ? Tensor::empty({rows}, stat_dtype(dt)) : Tensor();
            Tensor rstd = Tensor::empty({rows}, stat_dtype(dt));
            if (ln)
              cpu_ops().layernorm_fwd(y, mean, rstd, x.cpu, gamma.cpu, Tensor(), args);
            else
              cpu_ops().rmsnorm_fwd(y, rstd, x.cpu, gamma.cpu, args);
            Tensor mean_g = ln ? mean.to(kGpu) : Tensor(), rstd_g = rstd.to(kGpu);
            // f32 parameter grads (bf16 params' main grads), accumulated onto random values.
            auto dg = random_pair({h}, DType::f32, 15 + h),
                 db = random_pair({h}, DType::f32, 16 + h);
            Tensor dbc = ln ? db.cpu : Tensor(), dbg = ln ? db.gpu : Tensor();
            auto dx = nan_pair(shape, dt);
            // The CPU reference never aliases; the GPU writes dx over dy when in_place.
            Tensor dx_g = in_place ? dy_copy.gpu : dx.gpu;
            cpu_ops().norm_bwd_add(dx.cpu, dg.cpu, dbc, dy.cpu, with_dres ? dres.cpu : Tensor(),
                                   x.cpu, mean, rstd, gamma.cpu, args, kind);
            gpu_ops().norm_bwd_add(dx_g, dg.gpu, dbg, dy_copy.gpu, with_dres ? dres.gpu : Tensor(),
                                   x.gpu, mean_g, rstd_g, gamma.gpu, args, kind);
            EXPECT_TRUE(test::all_close(to_doubles(dx_g), to_doubles(dx.cpu), twice(dt)))
                << ctx << ": dx";
            EXPECT_TRUE(test::all_close(to_doubles(dg.gpu), to_doubles(dg.cpu), twice(DType::f32)))
                << ctx << ": dgamma";
            if (ln) {
              EXPECT_TRUE(
                  test::all_close(to_doubles(db.gpu), to_doubles(db.cpu), twice(DType::f32)))
                  << ctx << ": dbeta";
            }
          }
        }
      }
    }
  }
}

// norm_bwd_add == rmsnorm_bwd / layernorm_bwd + axpy on the GPU too, up to one rounding of the add
// (both round the norm's dx to the storage dtype first; the unfused kernel may contract).
TEST_P(CudaFusedNorm, BackwardAddMatchesUnfusedOnGpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  const Shape shape{33, 257};
  const int64_t h = shape.back(), rows = shape_numel(shape) / h;
  NormArgs args;
  auto x = random_pair(shape, dt, 21, 0.1, 2.0), dy = random_pair(shape, dt, 22),
       dres = random_pair(shape, dt, 23), gamma = random_pair({h}, dt, 24);
  Tensor y = Tensor::empty(shape, dt, kGpu), mean = Tensor::empty({rows}, stat_dtype(dt), kGpu),
         rstd = Tensor::empty({rows}, stat_dtype(dt), kGpu);
  gpu_ops().layernorm_fwd(y, mean, rstd, x.gpu, gamma.gpu, Tensor(), args);
  Tensor dg_u = Tensor::zeros({h}, DType::f32, kGpu), db_u = Tensor::zeros({h}, DType::f32, kGpu);
  Tensor dg_f = Tensor::zeros({h}, DType::f32, kGpu), db_f = Tensor::zeros({h}, DType::f32, kGpu);
  Tensor dx_u = nan_pair(shape, dt).gpu, dx_f = nan_pair(shape, dt).gpu;
  gpu_ops().layernorm_bwd(dx_u, dg_u, db_u, dy.gpu, x.gpu, mean, rstd, gamma.gpu, args);
  gpu_ops().axpy(dx_u, dres.gpu, 1.0f);
  gpu_ops().norm_bwd_add(dx_f, dg_f, db_f, dy.gpu, dres.gpu, x.gpu, mean, rstd, gamma.gpu, args,
                         NormKind::layernorm);
  EXPECT_TRUE(test::all_close(to_doubles(dx_f), to_doubles(dx_u), twice(dt)));
  // Parameter grads come from the same column-sum code: identical.
  EXPECT_EQ(to_doubles(dg_f), to_doubles(dg_u));
  EXPECT_EQ(to_doubles(db_f), to_doubles(db_u));
}

// The vector path (aligned rows, H % 8 == 0) against the scalar kernels (the same data through
// views one element into their storage, so no row is 16-byte aligned): dgamma / dbeta are the
// same f64 terms in the same order, the same bits; dx within twice the dtype's tolerance (the row
// sums are reduced in another order). bf16 / f16 only (the vector path's dtypes).
TEST_P(CudaFusedNorm, VectorPathMatchesScalarPath) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  if (dt != DType::bf16 && dt != DType::f16) GTEST_SKIP() << "no vector path for this dtype";
  // Rows of 8 to 128 vectors (blocks of 32 to 128 threads, some idle) and of 8192 (2 vectors a
  // thread of 512).
  for (const Shape& shape :
       {Shape{70, 768}, Shape{37, 1024}, Shape{5, 264}, Shape{3, 64}, Shape{9, 8192}}) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
      const bool ln = kind == NormKind::layernorm;
      const std::string ctx = std::string(kind_name(kind)) + " " + shape_str(shape);
      NormArgs args;
      const auto vx = random_values(static_cast<std::size_t>(n), 31, 0.1, 2.0),
                 vdy = random_values(static_cast<std::size_t>(n), 32),
                 vdres = random_values(static_cast<std::size_t>(n), 33);
      auto gamma = random_pair({h}, dt, 34);
      // The same values in an aligned tensor and one element into a device buffer.
      auto aligned = [&](const std::vector<double>& v) { return pair_of(v, shape, dt).gpu; };
      auto mis = [&](const std::vector<double>& v) {
        std::vector<double> shifted(1, 0.0);
        shifted.insert(shifted.end(), v.begin(), v.end());
        return pair_of(shifted, {n + 1}, dt).gpu.slice(1, n).view(shape);
      };
      const Tensor x_a = aligned(vx), dy_a = aligned(vdy), dres_a = aligned(vdres);
      const Tensor x_m = mis(vx), dy_m = mis(vdy), dres_m = mis(vdres);
      Tensor y = Tensor::empty(shape, dt, kGpu);
      Tensor mean = Tensor::empty({rows}, stat_dtype(dt), kGpu),
             rstd = Tensor::empty({rows}, stat_dtype(dt), kGpu);
      if (ln)
        gpu_ops().layernorm_fwd(y, mean, rstd, x_a, gamma.gpu, Tensor(), args);
      else
        gpu_ops().rmsnorm_fwd(y, rstd, x_a, gamma.gpu, args);
      Tensor dg_v = Tensor::zeros({h}, DType::f32, kGpu),
             db_v = Tensor::zeros({h}, DType::f32, kGpu);
      Tensor dg_s = Tensor::zeros({h}, DType::f32, kGpu),
             db_s = Tensor::zeros({h}, DType::f32, kGpu);
      Tensor dx_v = Tensor::empty(shape, dt, kGpu);
      auto dx_s_full = nan_pair({n + 1}, dt);
      Tensor dx_s = dx_s_full.gpu.slice(1, n).view(shape);
      Tensor no_db, no_mean;
      gpu_ops().norm_bwd_add(dx_v, dg_v, ln ? db_v : no_db, dy_a, dres_a, x_a, ln ? mean : no_mean,
                             rstd, gamma.gpu, args, kind);
      gpu_ops().norm_bwd_add(dx_s, dg_s, ln ? db_s : no_db, dy_m, dres_m, x_m, ln ? mean : no_mean,
                             rstd, gamma.gpu, args, kind);
      EXPECT_EQ(to_doubles(dg_v), to_doubles(dg_s)) << ctx << ": dgamma";
      if (ln) {
        EXPECT_EQ(to_doubles(db_v), to_doubles(db_s)) << ctx << ": dbeta";
      }
      EXPECT_TRUE(test::all_close(to_doubles(dx_v), to_doubles(dx_s), twice(dt))) << ctx << ": dx";
      // Forward: the scalar kernel on the misaligned copy, the same statistics within tolerance.
      Tensor y_s_full = Tensor::empty({n + 1}, dt, kGpu);
      Tensor y_s = y_s_full.slice(1, n).view(shape);
      Tensor mean_s = Tensor::empty({rows}, stat_dtype(dt), kGpu),
             rstd_s = Tensor::empty({rows}, stat_dtype(dt), kGpu);
      if (ln)
        gpu_ops().layernorm_fwd(y_s, mean_s, rstd_s, x_m, gamma.gpu, Tensor(), args);
      else
        gpu_ops().rmsnorm_fwd(y_s, rstd_s, x_m, gamma.gpu, args);
      EXPECT_TRUE(test::all_close(to_doubles(y), to_doubles(y_s), twice(dt))) << ctx << ": y";
      EXPECT_TRUE(test::all_close(to_doubles(rstd), to_doubles(rstd_s), twice(DType::f32)))
          << ctx << ": rstd";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaFusedNorm, ::testing::ValuesIn(test::kKernelDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace mg
