// CUDA-specific checks of the CUDA kernels, beyond the conformance tests in tests/unit/ops (which
// run on every platform against naive references): the CUDA results against the CPU platform's on
// shapes that exercise the GPU code paths (misaligned views for cuBLASLt, several key tiles in
// attention, rows wider than a block, more rows than a 1-D grid holds, many embedding groups), the
// counter-based streams bit for bit against the CPU (dropout masks, uniform init), deterministic
// reductions (the column sums' vector path bit for bit against their scalar path), aliasing, and
// ops on a non-default current stream. Every test skips without a GPU.
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "megatron/core/random/philox.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::random_values;
using test::to_doubles;

const Device kGpu = Device::cuda(0);

const ops::OpTable& cpu_ops() {
  return test::ops_on("cpu");
}
const ops::OpTable& gpu_ops() {
  return test::ops_on("cuda");
}

// The same values on the host and on the GPU (rounded to dtype once).
struct Pair {
  Tensor cpu, gpu;
  std::vector<double> rounded;
};
Pair pair_of(const std::vector<double>& v, const Shape& shape, DType dtype) {
  auto h = make_tensor(v, shape, dtype, Device::cpu());
  return {h.t, h.t.to(kGpu), h.rounded};
}
Pair random_pair(const Shape& shape, DType dtype, uint64_t seed) {
  return pair_of(random_values(static_cast<std::size_t>(shape_numel(shape)), seed), shape, dtype);
}
Pair empty_pair(const Shape& shape, DType dtype) {
  return {Tensor::empty(shape, dtype), Tensor::empty(shape, dtype, kGpu), {}};
}

// A looser tolerance for results of long reductions in narrow dtypes (CPU and GPU sum in
// different orders; each is within the dtype's tolerance of the exact value).
test::Tol twice(DType t) {
  const auto tol = test::tolerance(t);
  return {2 * tol.atol, 2 * tol.rtol};
}

// The vector-path counters of the loaded CUDA platform, or null.
platforms::cuda::VectorPathStats (*vector_path_stats_fn())() {
  return reinterpret_cast<platforms::cuda::VectorPathStats (*)()>(
      dlsym(RTLD_DEFAULT, "mg_cuda_vector_path_stats"));
}

std::vector<uint64_t> bits_of(const std::vector<double>& v) {
  std::vector<uint64_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<uint64_t>(v[i]);
  return b;
}

// The same [rows, width] values twice on the GPU: at the start of a fresh allocation (16-byte
// aligned) and one element into one (2-byte aligned for bf16/f16, so never the vector path).
struct AlignedAndNot {
  Tensor aligned, unaligned;
  std::vector<double> rounded;
};
AlignedAndNot aligned_and_not(int64_t rows, int64_t width, DType dtype, uint64_t seed) {
  const int64_t n = rows * width;
  std::vector<double> v = random_values(static_cast<std::size_t>(n), seed);
  std::vector<double> shifted(1, 0.5);
  shifted.insert(shifted.end(), v.begin(), v.end());
  auto a = make_tensor(v, {rows, width}, dtype, kGpu);
  auto u = make_tensor(shifted, {n + 1}, dtype, kGpu);
  return {a.t, u.t.slice(1, n).view({rows, width}), a.rounded};
}

class CudaOps : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaOps, GemmOnMisalignedViewsMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  // Views starting one element into their storage: 2-, 4- or 8-byte aligned pointers, which
  // cuBLASLt must be told about (MIN_ALIGNMENT preferences).
  const int64_t m = 37, k = 29, n = 19;
  auto a_full = random_pair({m * k + 1}, dtype(), 1);
  auto b_full = random_pair({k * n + 1}, dtype(), 2);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Shape as = ta ? Shape{k, m} : Shape{m, k};
      const Shape bs = tb ? Shape{n, k} : Shape{k, n};
      Tensor ac = a_full.cpu.slice(1, m * k).view(as), ag = a_full.gpu.slice(1, m * k).view(as);
      Tensor bc = b_full.cpu.slice(1, k * n).view(bs), bg = b_full.gpu.slice(1, k * n).view(bs);
      for (DType c_dtype : {dtype(), DType::f32}) {
        auto c = random_pair({m * n + 1}, c_dtype, 3);
        Tensor cc = c.cpu.slice(1, m * n).view({m, n}), cg = c.gpu.slice(1, m * n).view({m, n});
        const ops::GemmArgs args{ta, tb, 0.75f, 0.5f};
        cpu_ops().gemm(cc, ac, bc, args);
        gpu_ops().gemm(cg, ag, bg, args);
        EXPECT_TRUE(test::all_close(to_doubles(cg), to_doubles(cc), twice(c_dtype)))
            << "trans_a " << ta << " trans_b " << tb << " C " << dtype_name(c_dtype);
      }
    }
}

TEST_P(CudaOps, BatchedGemmAccumulatesLikeCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto a = random_pair({3, 67, 129}, dtype(), 4);
  auto b = random_pair({3, 129, 35}, dtype(), 5);
  auto c = random_pair({3, 67, 35}, DType::f32, 6);
  const ops::GemmArgs args{false, false, 1.0f, 1.0f};
  cpu_ops().gemm(c.cpu, a.cpu, b.cpu, args);
  gpu_ops().gemm(c.gpu, a.gpu, b.gpu, args);
  EXPECT_TRUE(test::all_close(to_doubles(c.gpu), to_doubles(c.cpu), twice(DType::f32)));
}

// 1001 elements: the scalar kernel; 1000: bf16 / f16 take dropout.cu's vector kernel, whose
// DropoutMask::keep8 starts at lane offset % 4 = 2, 0, 1, 3 of a Philox block.
TEST_P(CudaOps, DropoutMaskIsBitwiseTheCpuMask) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto stats = vector_path_stats_fn();
  if (!stats) GTEST_SKIP() << "mg_cuda_vector_path_stats not in the process";
  const bool half = dtype() == DType::bf16 || dtype() == DType::f16;
  for (int64_t n : {1001, 1000})
    for (uint64_t offset : {6ull, 8ull, 13ull, 3ull}) {
      auto x = random_pair({n}, dtype(), 7);
      auto y = empty_pair({n}, dtype());
      const ops::DropoutArgs args{0.3f, 0xfeedbeefcafe1234ull, offset};
      cpu_ops().dropout_fwd(y.cpu, x.cpu, args);
      const auto before = stats();
      gpu_ops().dropout_fwd(y.gpu, x.gpu, args);
      const auto after = stats();
      const std::string what = "n " + std::to_string(n) + " offset " + std::to_string(offset);
      EXPECT_EQ(after.dropout_vector - before.dropout_vector, half && n % 8 == 0 ? 1u : 0u) << what;
      const auto yc = to_doubles(y.cpu), yg = to_doubles(y.gpu);
      for (std::size_t i = 0; i < yc.size(); ++i) {
        EXPECT_EQ(yg[i] != 0.0, random::dropout_keep(args.seed, args.offset + i, args.p))
            << i << " " << what;
        EXPECT_EQ(yg[i] != 0.0, yc[i] != 0.0) << i << " " << what;
      }
      EXPECT_EQ(yg, yc) << what;  // x * (1 / (1 - p)) rounded once on both platforms
    }
}

// bias_dropout_add_fwd against the CPU: F = 24 (bf16 / f16: the vector kernel) and F = 13 (scalar),
// with and without dropout; the mask bit for bit, values within the dtype's tolerance (the add may
// be contracted differently).
TEST_P(CudaOps, BiasDropoutAddMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto stats = vector_path_stats_fn();
  if (!stats) GTEST_SKIP() << "mg_cuda_vector_path_stats not in the process";
  const bool half = dtype() == DType::bf16 || dtype() == DType::f16;
  for (int64_t f : {24, 13})
    for (float p : {0.0f, 0.25f}) {
      const int64_t rows = 37;
      auto x = random_pair({rows, f}, dtype(), 71), r = random_pair({rows, f}, dtype(), 72);
      auto b = random_pair({f}, dtype(), 73);
      for (uint64_t offset : {8ull, 5ull}) {  // keep8's first lane 0 and 1
        auto y = empty_pair({rows, f}, dtype());
        const ops::DropoutArgs args{p, 1234, offset};
        cpu_ops().bias_dropout_add_fwd(y.cpu, x.cpu, b.cpu, r.cpu, args);
        const auto before = stats();
        gpu_ops().bias_dropout_add_fwd(y.gpu, x.gpu, b.gpu, r.gpu, args);
        const auto after = stats();
        EXPECT_EQ(after.dropout_vector - before.dropout_vector, half && f % 8 == 0 ? 1u : 0u)
            << "F " << f;
        EXPECT_TRUE(test::all_close(to_doubles(y.gpu), to_doubles(y.cpu), test::tolerance(dtype())))
            << "F " << f << " p " << p << " offset " << offset;
      }
      // In place on the GPU (y = x), p == 0: dropout_bwd's no-op path leaves dy as it is.
      auto d = random_pair({rows, f}, dtype(), 74);
      const auto before = to_doubles(d.gpu);
      gpu_ops().dropout_bwd(d.gpu, d.gpu, ops::DropoutArgs{0.0f, 1, 0});
      EXPECT_EQ(to_doubles(d.gpu), before);
    }
}

TEST_P(CudaOps, UniformInitIsBitwiseTheCpuStream) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  for (uint64_t offset : {0ull, 3ull, (1ull << 33) + 1}) {
    const ops::InitArgs args{-0.5, 0.25, 77, offset};
    auto x = empty_pair({13, 31}, dtype());
    cpu_ops().init_uniform(x.cpu, args);
    gpu_ops().init_uniform(x.gpu, args);
    EXPECT_EQ(to_doubles(x.gpu), to_doubles(x.cpu)) << "offset " << offset;
    // normal() also runs the device's log/sin/cos: equal up to the last f64 ulp.
    cpu_ops().init_normal(x.cpu, ops::InitArgs{0.1, 0.02, 77, offset});
    gpu_ops().init_normal(x.gpu, ops::InitArgs{0.1, 0.02, 77, offset});
    EXPECT_TRUE(test::all_close(to_doubles(x.gpu), to_doubles(x.cpu), {0.0, 1e-6}));
  }
}

TEST_P(CudaOps, AttentionOverSeveralKeyTilesMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  // S = 300 spans three 128-key tiles; GQA; dropout; a document mask with padding.
  const int64_t s = 300, b = 2, nh = 4, ng = 2, hd = 40;
  std::vector<int32_t> docs(b * s);
  for (int64_t i = 0; i < b * s; ++i)
    docs[i] = (i % s) < 17 ? -1 : static_cast<int32_t>((i % s) / 97);
  for (bool causal : {true, false}) {
    for (bool masked : {false, true}) {
      auto q = random_pair({s, b, nh, hd}, dtype(), 8);
      auto k = random_pair({s, b, ng, hd}, dtype(), 9);
      auto v = random_pair({s, b, ng, hd}, dtype(), 10);
      auto dout = random_pair({s, b, nh, hd}, dtype(), 11);
      const DType lse_t = dtype() == DType::f64 ? DType::f64 : DType::f32;
      ops::AttentionArgs ac, ag;
      ac.causal = ag.causal = causal;
      ac.dropout = ag.dropout = {0.1f, 5, 1};
      if (masked) {
        ac.doc_ids = Tensor::from_vector(docs, {b, s}, DType::i32);
        ag.doc_ids = ac.doc_ids.to(kGpu);
      }
      auto out = empty_pair({s, b, nh, hd}, dtype());
      auto lse = empty_pair({b, nh, s}, lse_t);
      cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
      gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);
      auto dq = empty_pair({s, b, nh, hd}, dtype());
      auto dk = empty_pair({s, b, ng, hd}, dtype());
      auto dv = empty_pair({s, b, ng, hd}, dtype());
      cpu_ops().attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out.cpu,
                              lse.cpu, ac);
      gpu_ops().attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out.gpu,
                              lse.gpu, ag);
      const std::string what =
          std::string("causal ") + (causal ? "1" : "0") + " masked " + (masked ? "1" : "0");
      EXPECT_TRUE(test::all_close(to_doubles(out.gpu), to_doubles(out.cpu), twice(dtype())))
          << "out " << what;
      EXPECT_TRUE(test::all_close(to_doubles(lse.gpu), to_doubles(lse.cpu), twice(lse_t)))
          << "lse " << what;
      for (auto* g : {&dq, &dk, &dv})
        EXPECT_TRUE(test::all_close(to_doubles(g->gpu), to_doubles(g->cpu), twice(dtype())))
            << "grads " << what;
    }
  }
}

TEST_P(CudaOps, AttentionHeadDimsUpTo128MatchCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  // Head dims of both tiled variants (<= 64 and <= 128, zero-padded), and one past them (the row
  // kernels); S = 130 ends in a partial 64-row tile; cu_seqlens documents; MQA; dropout.
  const int64_t s = 130, b = 2, nh = 3, ng = 1;
  const std::vector<int32_t> cu = {0, 50, 64, 129, 130};
  for (int64_t hd : {64, 72, 128, 136}) {
    for (bool causal : {true, false}) {
      auto q = random_pair({s, b, nh, hd}, dtype(), 21);
      auto k = random_pair({s, b, ng, hd}, dtype(), 22);
      auto v = random_pair({s, b, ng, hd}, dtype(), 23);
      auto dout = random_pair({s, b, nh, hd}, dtype(), 24);
      const DType lse_t = dtype() == DType::f64 ? DType::f64 : DType::f32;
      ops::AttentionArgs ac, ag;
      ac.causal = ag.causal = causal;
      ac.dropout = ag.dropout = {0.2f, 9, 12345};
      ac.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())}, DType::i32);
      ag.cu_seqlens = ac.cu_seqlens.to(kGpu);
      auto out = empty_pair({s, b, nh, hd}, dtype());
      auto lse = empty_pair({b, nh, s}, lse_t);
      cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
      gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);
      auto dq = empty_pair({s, b, nh, hd}, dtype());
      auto dk = empty_pair({s, b, ng, hd}, dtype());
      auto dv = empty_pair({s, b, ng, hd}, dtype());
      cpu_ops().attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out.cpu,
                              lse.cpu, ac);
      gpu_ops().attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out.gpu,
                              lse.gpu, ag);
      const std::string what = "hd " + std::to_string(hd) + " causal " + (causal ? "1" : "0");
      EXPECT_TRUE(test::all_close(to_doubles(out.gpu), to_doubles(out.cpu), twice(dtype())))
          << "out " << what;
      EXPECT_TRUE(test::all_close(to_doubles(lse.gpu), to_doubles(lse.cpu), twice(lse_t)))
          << "lse " << what;
      for (auto* g : {&dq, &dk, &dv})
        EXPECT_TRUE(test::all_close(to_doubles(g->gpu), to_doubles(g->cpu), twice(dtype())))
            << "grads " << what;
    }
  }
}

TEST_P(CudaOps, RowOpsOnWideRowsAndManyRowsMatchCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  // 3001 features: more than a block's threads; 70001 rows: more than a 1-D grid's 65535 blocks.
  // The many rows are 8 wide: rows of 3 random values often have a tiny variance (rstd up to ~80),
  // and LayerNorm's dx then cancels so badly that the CPU's own f32 result is 7x the f32 tolerance
  // away from f64 (4 elements of 70001 x 3); at width 8 it stays under 0.06x of it.
  for (Shape shape : {Shape{5, 3001}, Shape{70001, 8}}) {
    const int64_t h = shape[1], rows = shape[0];
    auto x = random_pair(shape, dtype(), 12);
    auto dy = random_pair(shape, dtype(), 13);
    auto gamma = random_pair({h}, dtype(), 14);
    auto beta = random_pair({h}, dtype(), 15);
    const DType st = dtype() == DType::f64 ? DType::f64 : DType::f32;
    auto y = empty_pair(shape, dtype());
    auto mean = empty_pair({rows}, st), rstd = empty_pair({rows}, st);
    const ops::NormArgs args{1e-5f, true};
    cpu_ops().layernorm_fwd(y.cpu, mean.cpu, rstd.cpu, x.cpu, gamma.cpu, beta.cpu, args);
    gpu_ops().layernorm_fwd(y.gpu, mean.gpu, rstd.gpu, x.gpu, gamma.gpu, beta.gpu, args);
    EXPECT_TRUE(test::all_close(to_doubles(y.gpu), to_doubles(y.cpu), twice(dtype())));
    auto dx = empty_pair(shape, dtype());
    auto dgamma = pair_of(std::vector<double>(h, 0.5), {h}, DType::f32);
    auto dbeta = pair_of(std::vector<double>(h, -0.5), {h}, DType::f32);
    cpu_ops().layernorm_bwd(dx.cpu, dgamma.cpu, dbeta.cpu, dy.cpu, x.cpu, mean.cpu, rstd.cpu,
                            gamma.cpu, args);
    gpu_ops().layernorm_bwd(dx.gpu, dgamma.gpu, dbeta.gpu, dy.gpu, x.gpu, mean.gpu, rstd.gpu,
                            gamma.gpu, args);
    EXPECT_TRUE(test::all_close(to_doubles(dx.gpu), to_doubles(dx.cpu), twice(dtype())));
    const test::Tol sum_tol{1e-3 * std::sqrt(double(rows)), 1e-3};
    EXPECT_TRUE(test::all_close(to_doubles(dgamma.gpu), to_doubles(dgamma.cpu), sum_tol));
    EXPECT_TRUE(test::all_close(to_doubles(dbeta.gpu), to_doubles(dbeta.cpu), sum_tol));
    auto sy = empty_pair(shape, dtype());
    cpu_ops().softmax_fwd(sy.cpu, x.cpu, 1.7f);
    gpu_ops().softmax_fwd(sy.gpu, x.gpu, 1.7f);
    EXPECT_TRUE(test::all_close(to_doubles(sy.gpu), to_doubles(sy.cpu), twice(dtype())));
  }
}

TEST_P(CudaOps, CrossEntropyBackwardInPlaceMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const int64_t n = 37, v = 1000;
  auto logits = random_pair({n, v}, dtype(), 16);
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = (i * 379) % v;
  Tensor tc = Tensor::from_vector(t, {n}, DType::i64), tg = tc.to(kGpu);
  const DType st = dtype() == DType::f64 ? DType::f64 : DType::f32;
  auto loss = empty_pair({n}, st), mx = empty_pair({n}, st), se = empty_pair({n}, st);
  cpu_ops().cross_entropy_fwd(loss.cpu, mx.cpu, se.cpu, logits.cpu, tc);
  gpu_ops().cross_entropy_fwd(loss.gpu, mx.gpu, se.gpu, logits.gpu, tg);
  EXPECT_TRUE(test::all_close(to_doubles(loss.gpu), to_doubles(loss.cpu), twice(st)));
  auto dl = random_pair({n}, st, 17);
  cpu_ops().cross_entropy_bwd(logits.cpu, dl.cpu, logits.cpu, mx.cpu, se.cpu, tc, 0);
  gpu_ops().cross_entropy_bwd(logits.gpu, dl.gpu, logits.gpu, mx.gpu, se.gpu, tg, 0);
  EXPECT_TRUE(test::all_close(to_doubles(logits.gpu), to_doubles(logits.cpu), twice(dtype())));
}

TEST_P(CudaOps, EmbeddingBackwardWithManyRowsMatchesCpuAndIsDeterministic) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const int64_t n = 20011, h = 33, vocab = 5003, start = 1000;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7919) % 7001;
  Tensor ic = Tensor::from_vector(ids, {n}, DType::i64), ig = ic.to(kGpu);
  auto dout = random_pair({n, h}, dtype(), 18);
  auto dw = pair_of(random_values(vocab * h, 19), {vocab, h}, DType::f32);
  Tensor dw2 = dw.gpu.clone();
  cpu_ops().embedding_bwd(dw.cpu, dout.cpu, ic, start);
  gpu_ops().embedding_bwd(dw.gpu, dout.gpu, ig, start);
  gpu_ops().embedding_bwd(dw2, dout.gpu, ig, start);
  EXPECT_EQ(to_doubles(dw.gpu), to_doubles(dw2));
  EXPECT_TRUE(test::all_close(to_doubles(dw.gpu), to_doubles(dw.cpu), twice(DType::f32)));
  auto w = random_pair({vocab, h}, dtype(), 20);
  auto out = empty_pair({n, h}, dtype());
  cpu_ops().embedding_fwd(out.cpu, ic, w.cpu, start);
  gpu_ops().embedding_fwd(out.gpu, ig, w.gpu, start);
  EXPECT_EQ(to_doubles(out.gpu), to_doubles(out.cpu));
}

// embedding_bwd's vector kernel (bf16 / f16 dout, H % 8 == 0, 16-byte aligned: 8 columns per
// thread from one 16-byte load) sums each column over a row's tokens in the scalar kernel's order:
// the same bits as an odd-offset view of the same dout, which takes the scalar kernel. H 64 and
// 776 (97 column groups: a partial warp); a shard at 1000 with ids outside it.
TEST_P(CudaOps, EmbeddingBackwardVectorKernelIsBitwiseTheScalarKernel) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const int64_t n = 4099, vocab = 701, start = 1000;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = 900 + (i * 7919) % 1000;
  const Tensor ig = Tensor::from_vector(ids, {n}, DType::i64).to(kGpu);
  for (const int64_t h : {64, 776}) {
    const auto dout = aligned_and_not(n, h, dtype(), 60 + h);
    const auto dw0 = random_values(static_cast<std::size_t>(vocab * h), 61);
    Tensor dw_a = make_tensor(dw0, {vocab, h}, DType::f32, kGpu).t, dw_u = dw_a.clone();
    gpu_ops().embedding_bwd(dw_a, dout.aligned, ig, start);
    gpu_ops().embedding_bwd(dw_u, dout.unaligned, ig, start);
    EXPECT_EQ(bits_of(to_doubles(dw_a)), bits_of(to_doubles(dw_u)))
        << "H " << h << " " << dtype_name(dtype());
    // Against the CPU within f32 rounding (the scatter of the same rounded dout).
    Tensor dw_c = make_tensor(dw0, {vocab, h}, DType::f32, Device::cpu()).t;
    cpu_ops().embedding_bwd(dw_c, make_tensor(dout.rounded, {n, h}, dtype(), Device::cpu()).t,
                            Tensor::from_vector(ids, {n}, DType::i64), start);
    EXPECT_TRUE(test::all_close(to_doubles(dw_a), to_doubles(dw_c), twice(DType::f32)))
        << "H " << h << " " << dtype_name(dtype());
  }
}

// axpy of f32 / bf16 / f16 data aligned to 4 elements takes 4 elements a thread; views one element
// in take the scalar kernel: the same bits (the one element expression). y of this dtype or f32,
// x of this dtype; n 1, 7 (tail only / tail), 4099 and 2^20 + 3.
TEST_P(CudaOps, AxpyVectorKernelIsBitwiseTheScalarKernel) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  for (const DType ty : {dtype(), DType::f32})
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, (int64_t{1} << 20) + 3}) {
      const std::string what = std::string(dtype_name(ty)) +
                               " += " + std::string(dtype_name(dtype())) + " n " +
                               std::to_string(n);
      const auto x = aligned_and_not(1, n, dtype(), 70 + n);
      const auto y = aligned_and_not(1, n, ty, 71 + n);
      Tensor ya = y.aligned.clone(), yu = y.unaligned;  // yu: a view one element in
      gpu_ops().axpy(ya, x.aligned, 0.37f);
      gpu_ops().axpy(yu, x.unaligned, 0.37f);
      EXPECT_EQ(bits_of(to_doubles(ya)), bits_of(to_doubles(yu))) << what;
      Tensor yc = make_tensor(y.rounded, {1, n}, ty, Device::cpu()).t;
      cpu_ops().axpy(yc, make_tensor(x.rounded, {1, n}, dtype(), Device::cpu()).t, 0.37f);
      EXPECT_TRUE(test::all_close(to_doubles(ya), to_doubles(yc), twice(ty))) << what;
    }
}

TEST_P(CudaOps, ReductionsAreDeterministicAndMatchCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto big = random_pair({1 << 20}, dtype(), 21);
  auto small = random_pair({13}, DType::bf16, 22);
  Tensor oc = Tensor::empty({1}, DType::f64), og = Tensor::empty({1}, DType::f64, kGpu);
  Tensor og2 = Tensor::empty({1}, DType::f64, kGpu);
  cpu_ops().l2_norm_sq(oc, std::vector<Tensor>{big.cpu, small.cpu});
  gpu_ops().l2_norm_sq(og, std::vector<Tensor>{big.gpu, small.gpu});
  gpu_ops().l2_norm_sq(og2, std::vector<Tensor>{big.gpu, small.gpu});
  EXPECT_EQ(to_doubles(og), to_doubles(og2));
  EXPECT_TRUE(test::all_close(to_doubles(og), to_doubles(oc), {0.0, 1e-12}));
  auto dy = random_pair({4099, 7}, dtype(), 23);
  auto db = pair_of(std::vector<double>(7, 1.0), {7}, DType::f32);
  Tensor db2 = db.gpu.clone();
  cpu_ops().bias_grad(db.cpu, dy.cpu);
  gpu_ops().bias_grad(db.gpu, dy.gpu);
  gpu_ops().bias_grad(db2, dy.gpu);
  EXPECT_EQ(to_doubles(db.gpu), to_doubles(db2));
  EXPECT_TRUE(test::all_close(to_doubles(db.gpu), to_doubles(db.cpu), {1e-4, 1e-5}));
}

// reduce.cuh's column_finish (every column sum's last pass) against the host's f64 emulation of
// its order (column_finish_kernel: 32 slices of chunks l, l + 32, ... in order, a tree over the
// slices, then out + the sum): bit for bit, into f64 and f32 outputs. The partials' magnitudes
// span 2^-30 .. 2^30 with both signs, so another order would show in the bits. Chunk counts below,
// at and above the 32 slices (1, 5, 32, 129, 512, 1024 = column_chunking's most, 5000); widths
// below, at and not a multiple of the 8 columns of a block.
TEST(CudaColumnFinish, SumsInTheDocumentedOrder) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  using Fn = void (*)(Tensor&, const Tensor&);
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "mg_cuda_column_finish_with"));
  if (!fn) GTEST_SKIP() << "mg_cuda_column_finish_with not in the process";
  int order_shows = 0;  // columns whose chunk-order serial sum has other bits than the tree's
  for (int64_t chunks : {1, 5, 32, 129, 512, 1024, 5000})
    for (int64_t width : {1, 3, 8, 13, 770, 3072}) {
      if (chunks > 1024 && width > 770) continue;  // keeps the host side small
      std::vector<double> p =
          random_values(static_cast<std::size_t>(chunks * width),
                        static_cast<uint64_t>(chunks * 7919 + width), -1.0, 1.0);
      for (std::size_t i = 0; i < p.size(); ++i)
        p[i] = std::ldexp(p[i], static_cast<int>(i % 61) - 30);
      const std::vector<double> init = random_values(static_cast<std::size_t>(width), 77);
      const Tensor partial = Tensor::from_vector(p, {chunks, width}, DType::f64).to(kGpu);
      // The documented order on the host.
      std::vector<double> tree(static_cast<std::size_t>(width));
      for (int64_t f = 0; f < width; ++f) {
        double slice[32];
        for (int l = 0; l < 32; ++l) {
          double acc = 0.0;
          for (int64_t c = l; c < chunks; c += 32)
            acc += p[static_cast<std::size_t>(c * width + f)];
          slice[l] = acc;
        }
        for (int o = 16; o > 0; o >>= 1)
          for (int l = 0; l < o; ++l) slice[l] += slice[l + o];
        tree[static_cast<std::size_t>(f)] = slice[0];
        double serial = 0.0;
        for (int64_t c = 0; c < chunks; ++c) serial += p[static_cast<std::size_t>(c * width + f)];
        if (std::bit_cast<uint64_t>(serial) != std::bit_cast<uint64_t>(slice[0])) ++order_shows;
      }
      for (DType out_t : {DType::f64, DType::f32}) {
        const std::string what = "chunks " + std::to_string(chunks) + " width " +
                                 std::to_string(width) + " " + std::string(dtype_name(out_t));
        Tensor out = make_tensor(init, {width}, out_t, kGpu).t;
        const std::vector<double> start = to_doubles(out);
        fn(out, partial);
        std::vector<double> want(static_cast<std::size_t>(width));
        for (std::size_t f = 0; f < want.size(); ++f) {
          const double sum = start[f] + tree[f];
          want[f] = out_t == DType::f32 ? static_cast<double>(static_cast<float>(sum)) : sum;
        }
        EXPECT_EQ(bits_of(to_doubles(out)), bits_of(want)) << what;
      }
    }
  EXPECT_GT(order_shows, 0) << "the partials must be such that the order of the adds shows";
}

// bias_grad and bias_dropout_add_bwd's dbias (reduce.cuh's MatrixTerm; dropout.cu's one-pass
// dx + dbias kernel, or MaskedGrad): for bf16/f16 rows a multiple of 8 wide and 16-byte aligned
// the 8-column vector kernel runs, and its sums are the scalar kernel's bits (the same f64 terms
// added in the same order per chunk), into an f64 dbias (the partials' full bits) and an f32 one.
// Widths not a multiple of 8, unaligned views and f32/f64 take the scalar kernel. Rows: one,
// fewer than a chunk, a last chunk of 3 rows (4099 = 256 * 16 + 3), and 1024 chunks of 33 rows
// with the last 24 chunks empty (33000).
TEST_P(CudaOps, ColumnSumVectorPathIsBitwiseTheScalarPath) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto stats = vector_path_stats_fn();
  if (!stats) GTEST_SKIP() << "mg_cuda_vector_path_stats not in the process";
  const bool half = dtype() == DType::bf16 || dtype() == DType::f16;
  struct Case {
    int64_t rows, width;
  };
  for (const Case c : {Case{1, 8}, Case{37, 24}, Case{4099, 776}, Case{4099, 1000}, Case{4099, 12},
                       Case{37, 770}, Case{33000, 16}}) {
    const bool vector = half && c.width % 8 == 0;
    const std::string what = "rows " + std::to_string(c.rows) + " width " +
                             std::to_string(c.width) + " " + std::string(dtype_name(dtype()));
    const auto x = aligned_and_not(c.rows, c.width, dtype(), 31 + c.width);
    const auto init = random_values(static_cast<std::size_t>(c.width), 32);
    for (DType out_t : {DType::f64, DType::f32}) {
      Tensor db_v = make_tensor(init, {c.width}, out_t, kGpu).t, db_s = db_v.clone();
      const auto before = stats();
      gpu_ops().bias_grad(db_v, x.aligned);
      const auto mid = stats();
      gpu_ops().bias_grad(db_s, x.unaligned);
      const auto after = stats();
      EXPECT_EQ(mid.column_sum_vector - before.column_sum_vector, vector ? 1u : 0u) << what;
      EXPECT_EQ(after.column_sum_vector - mid.column_sum_vector, 0u) << what;
      EXPECT_EQ(after.column_sum_scalar - mid.column_sum_scalar, 1u) << what;
      const auto got = to_doubles(db_v);
      EXPECT_EQ(bits_of(got), bits_of(to_doubles(db_s))) << "bias_grad " << what;
      if (out_t == DType::f64) {
        // Against the exact sums (long double): two-level f64 summation, at most
        // rows_per_chunk + chunks + 1 roundings of magnitude <= u * (|init| + sum |x|).
        const int64_t chunks = std::min<int64_t>(1024, (c.rows + 15) / 16);
        const int64_t per_chunk = (c.rows + chunks - 1) / chunks;
        for (int64_t f = 0; f < c.width; ++f) {
          long double exact = init[f], mag = std::fabs(init[f]);
          for (int64_t r = 0; r < c.rows; ++r) {
            exact += x.rounded[r * c.width + f];
            mag += std::fabs(x.rounded[r * c.width + f]);
          }
          const double bound = double(per_chunk + chunks + 1) * 0x1p-53 * double(mag);
          ASSERT_LE(std::fabs(got[f] - double(exact)), bound) << what << " column " << f;
        }
      }

      // p == 0 in place (dx = dy, left as it is): dbias gets bias_grad's terms, so its bits.
      {
        Tensor dy = x.aligned.clone();
        Tensor dbd = make_tensor(init, {c.width}, out_t, kGpu).t;
        gpu_ops().bias_dropout_add_bwd(dy, dbd, dy, ops::DropoutArgs{0.0f, 1, 0});
        EXPECT_EQ(bits_of(to_doubles(dbd)), bits_of(got)) << "p 0 " << what;
        EXPECT_EQ(bits_of(to_doubles(dy)), bits_of(to_doubles(x.aligned))) << "p 0 " << what;
      }
      // bias_dropout_add_bwd: the mask of element i is keep(i) on both paths (the vector path's
      // DropoutMask::keep8 takes lanes (offset + i) % 4 = 0, 1, 2, 3 of its first Philox block).
      for (uint64_t offset : {8ull, 5ull, 14ull, 7ull}) {
        const ops::DropoutArgs args{0.25f, 0x1234abcdull, offset};
        const std::string at = what + " offset " + std::to_string(offset);
        Tensor dbd_v = make_tensor(init, {c.width}, out_t, kGpu).t, dbd_s = dbd_v.clone();
        Tensor dx_v = Tensor::empty({c.rows, c.width}, dtype(), kGpu);
        Tensor dx_s = Tensor::empty({c.rows, c.width}, dtype(), kGpu);
        const auto b2 = stats();
        gpu_ops().bias_dropout_add_bwd(dx_v, dbd_v, x.aligned, args);
        const auto m2 = stats();
        gpu_ops().bias_dropout_add_bwd(dx_s, dbd_s, x.unaligned, args);
        const auto a2 = stats();
        EXPECT_EQ(m2.column_sum_vector - b2.column_sum_vector, vector ? 1u : 0u) << at;
        EXPECT_EQ(a2.column_sum_scalar - m2.column_sum_scalar, 1u) << at;
        // dx: dropout_vec_kernel where dx and dy are aligned (and n % 8 == 0).
        EXPECT_EQ(m2.dropout_vector - b2.dropout_vector, vector ? 1u : 0u) << at;
        EXPECT_EQ(a2.dropout_scalar - m2.dropout_scalar, 1u) << at;
        EXPECT_EQ(bits_of(to_doubles(dbd_v)), bits_of(to_doubles(dbd_s)))
            << "bias_dropout_add_bwd " << at;
        const auto dx = to_doubles(dx_v);
        EXPECT_EQ(bits_of(dx), bits_of(to_doubles(dx_s))) << at;
        // In place (dx = dy): the same bits (the one-pass kernel reads before it writes).
        Tensor inplace = x.aligned.clone();
        Tensor dbd_i = make_tensor(init, {c.width}, out_t, kGpu).t;
        gpu_ops().bias_dropout_add_bwd(inplace, dbd_i, inplace, args);
        EXPECT_EQ(bits_of(to_doubles(inplace)), bits_of(dx)) << "in place " << at;
        EXPECT_EQ(bits_of(to_doubles(dbd_i)), bits_of(to_doubles(dbd_v))) << "in place " << at;
        if (c.rows * c.width >= 64) {  // the mask took part: some elements dropped, some kept
          const auto dropped = std::count(dx.begin(), dx.end(), 0.0);
          EXPECT_GT(dropped, 0) << at;
          EXPECT_LT(dropped, static_cast<std::ptrdiff_t>(dx.size())) << at;
        }
      }
    }
  }
}

// cross_entropy_fwd, ce_local_max and ce_local_stats: for bf16/f16 logits with V % 8 == 0 and
// 16-byte aligned rows the row passes load 16 bytes at a time through a shared-memory tile of 8192
// logits, and give the scalar passes' bits (each thread sums its scalar-loop elements in the
// scalar order). V: one vector, a partial tile, one tile and 8 more, two tiles and a bit; V =
// 1001 and unaligned views take the scalar passes. cross_entropy_fwd's vector kernels, chosen by
// MG_CUDA_CE_FWD (set here in turn, restored after):
//   - row-cache (the default) caches the row in shared memory when its 2 V bytes fit (every V here
//     up to gpt2's 50304, 100.6 KB, on sm_80 and sm_90; V = 131072, 256 KiB, fits no device and
//     takes the two-pass kernel): the scalar passes' bits;
//   - two-pass: the scalar passes' bits;
//   - online (a running max and rescaled sum per thread over 8-logit pieces, combined by the
//   block):
//     the same max; sum_exp within the derived bound of two positive sums of the same terms. The
//     scalar sum adds n_t = ceil(V / 256) terms per thread then a block reduction of depth 12 (5
//     shuffles, 7 warp partials); the online sum per thread n_t terms, at most n_t / 8 rescales (an
//     exp and a product: 2 roundings each) and one final rescale, then the same reduction. With
//     expf within 2 ulp (CUDA's documented bound) on every term:
//       |S_online - S_scalar| <= (gamma_{n_t + 12} + gamma_{n_t + n_t / 4 + 16} + 4 u) S_scalar,
//     u = 2^-24, gamma_k = k u / (1 - k u); the loss log(S) + M - x_t then differs by at most
//     rel / (1 - rel) plus the roundings of its three operations on each side (6 u (|log S| + |M|
//     + |x_t|)).
TEST_P(CudaOps, CrossEntropyVectorRowPassesAreBitwiseTheScalarPasses) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto stats = vector_path_stats_fn();
  if (!stats) GTEST_SKIP() << "mg_cuda_vector_path_stats not in the process";
  const bool half = dtype() == DType::bf16 || dtype() == DType::f16;
  const DType st = dtype() == DType::f64 ? DType::f64 : DType::f32;
  struct RestoreEnv {  // MG_CUDA_CE_FWD as it was before the test
    const char* name = "MG_CUDA_CE_FWD";
    std::optional<std::string> old;
    RestoreEnv() {
      if (const char* v = std::getenv(name)) old = v;
    }
    ~RestoreEnv() {
      if (old)
        setenv(name, old->c_str(), 1);
      else
        unsetenv(name);
    }
  } restore;
  for (const int64_t v : {8, 1000, 8200, 16400, 1001, 50304, 131072}) {
    const int64_t n = 5;
    const bool vector = half && v % 8 == 0;
    const std::string what = "V " + std::to_string(v) + " " + std::string(dtype_name(dtype()));
    const auto x = aligned_and_not(n, v, dtype(), 40 + v);
    std::vector<int64_t> t(n);
    for (int64_t i = 0; i < n; ++i) t[i] = (i * 379 + 7) % v;
    const Tensor tc = Tensor::from_vector(t, {n}, DType::i64), tg = tc.to(kGpu);
    struct Out {
      Tensor loss, mx, se;
    };
    auto run_fwd = [&](const Tensor& logits) {
      Out o{Tensor::empty({n}, st, kGpu), Tensor::empty({n}, st, kGpu),
            Tensor::empty({n}, st, kGpu)};
      gpu_ops().cross_entropy_fwd(o.loss, o.mx, o.se, logits, tg);
      return o;
    };
    const auto s1 = stats();
    const Out u = run_fwd(x.unaligned);
    const auto s2 = stats();
    EXPECT_EQ(s2.ce_rows_vector - s1.ce_rows_vector, 0u) << what;
    EXPECT_EQ(s2.ce_row_cache - s1.ce_row_cache, 0u) << what;
    EXPECT_EQ(s2.ce_online - s1.ce_online, 0u) << what;
    EXPECT_EQ(s2.ce_rows_scalar - s1.ce_rows_scalar, 1u) << what;
    Out a;
    for (const std::string mode : {"online", "two-pass", "row-cache"}) {
      ASSERT_EQ(setenv("MG_CUDA_CE_FWD", mode.c_str(), 1), 0);
      const std::string at = what + " " + mode;
      const auto m0 = stats();
      a = run_fwd(x.aligned);
      const auto m1 = stats();
      const bool cached = vector && mode == "row-cache" && v <= 50304;
      const bool online = vector && mode == "online";
      EXPECT_EQ(m1.ce_rows_vector - m0.ce_rows_vector, vector ? 1u : 0u) << at;
      EXPECT_EQ(m1.ce_row_cache - m0.ce_row_cache, cached ? 1u : 0u) << at;
      EXPECT_EQ(m1.ce_online - m0.ce_online, online ? 1u : 0u) << at;
      EXPECT_EQ(bits_of(to_doubles(a.mx)), bits_of(to_doubles(u.mx))) << "max " << at;
      if (!online) {
        for (auto [got, ref, name] :
             {std::tuple{&a.loss, &u.loss, "loss"}, std::tuple{&a.se, &u.se, "sum_exp"}})
          EXPECT_EQ(bits_of(to_doubles(*got)), bits_of(to_doubles(*ref))) << name << " " << at;
        continue;
      }
      const double uu = std::ldexp(1.0, -24);
      auto gamma = [&](double k) { return k * uu / (1 - k * uu); };
      const double nt = static_cast<double>((v + 255) / 256);
      const double rel = gamma(nt + 12) + gamma(nt + nt / 4 + 16) + 4 * uu;
      const auto lo = to_doubles(a.loss), lu = to_doubles(u.loss), so = to_doubles(a.se),
                 su = to_doubles(u.se), mu = to_doubles(u.mx);
      const auto xr = x.rounded;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_LE(std::fabs(so[i] - su[i]), rel * su[i]) << "sum_exp row " << i << " " << at;
        const double terms = std::fabs(std::log(su[i])) + std::fabs(mu[i]) +
                             std::fabs(xr[static_cast<std::size_t>(i * v + t[i])]);
        // |log a - log b| <= |a - b| / min(a, b) <= rel / (1 - rel).
        EXPECT_LE(std::fabs(lo[i] - lu[i]), rel / (1 - rel) + 6 * uu * terms)
            << "loss row " << i << " " << at;
      }
    }
    // Against the CPU, as CrossEntropyBackwardInPlaceMatchesCpu.
    auto xc = make_tensor(x.rounded, {n, v}, dtype(), Device::cpu()).t;
    Tensor lc = Tensor::empty({n}, st), mc = Tensor::empty({n}, st), sc = Tensor::empty({n}, st);
    cpu_ops().cross_entropy_fwd(lc, mc, sc, xc, tc);
    EXPECT_TRUE(test::all_close(to_doubles(a.loss), to_doubles(lc), twice(st))) << what;

    // The vocab-parallel pieces on a shard starting at vocab_start 3.
    Tensor lm_a = Tensor::empty({n}, st, kGpu), lm_u = Tensor::empty({n}, st, kGpu);
    gpu_ops().ce_local_max(lm_a, x.aligned);
    gpu_ops().ce_local_max(lm_u, x.unaligned);
    EXPECT_EQ(bits_of(to_doubles(lm_a)), bits_of(to_doubles(lm_u))) << "local max " << what;
    Tensor ls_a = Tensor::empty({n}, st, kGpu), ls_u = Tensor::empty({n}, st, kGpu);
    Tensor lt_a = Tensor::empty({n}, st, kGpu), lt_u = Tensor::empty({n}, st, kGpu);
    const auto s3 = stats();
    gpu_ops().ce_local_stats(ls_a, lt_a, x.aligned, lm_a, tg, 3);
    gpu_ops().ce_local_stats(ls_u, lt_u, x.unaligned, lm_a, tg, 3);
    const auto s4 = stats();
    EXPECT_EQ(s4.ce_rows_vector - s3.ce_rows_vector, vector ? 1u : 0u) << what;
    EXPECT_EQ(bits_of(to_doubles(ls_a)), bits_of(to_doubles(ls_u))) << "local sum_exp " << what;
    EXPECT_EQ(bits_of(to_doubles(lt_a)), bits_of(to_doubles(lt_u))) << "target logit " << what;
  }
}

TEST_P(CudaOps, OpsFollowTheCurrentStream) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = *plugin::global_registry().find_platform("cuda");
  auto stream = p.create_stream(0);
  auto x = random_pair({257, 129}, dtype(), 24);
  auto y = empty_pair({257, 129}, dtype());
  cpu_ops().gelu_fwd(y.cpu, x.cpu, ops::GeluApprox::tanh);
  p.synchronize(0);
  p.set_current_stream(0, stream.get());
  gpu_ops().gelu_fwd(y.gpu, x.gpu, ops::GeluApprox::tanh);
  const auto got = to_doubles(y.gpu);  // the copy runs on the same current stream: ordered
  p.set_current_stream(0, nullptr);
  EXPECT_TRUE(test::all_close(got, to_doubles(y.cpu), test::tolerance(dtype())));
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaOps, ::testing::ValuesIn(test::kKernelDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mg
