// The CUDA RoPE kernels (platforms/cuda/rope.cu):
//   - the vector apply kernel (bf16 / f16, 16-byte accesses) against the scalar one forced on the
//     same call (rope_apply_with, cuda_kernels.h): bit for bit, forward and backward, interleaved
//     and not, rot < HD (in place and out of place, so the pass-through copy), per-batch and flat
//     position ids (i32 / i64) with positions outside the cached table (negative, past it: the
//     kernels' own cos/sin), offsets, 3 heads, HD 64 and 128; each case also within the dtype's
//     tolerance of the CPU op. The stats must show which kernel ran: a case the vector kernel
//     serves runs it, a misaligned view or a width it cannot take runs the scalar one.
//   - the cos/sin table cache: the q and k calls of a layer share one table per sign, a new
//     base / rot / scaling / sign builds another, position ids of any content reuse it (and stay
//     right after being overwritten), more than kMaxTables keys evict (never more than 8 cached).
// Every test skips without a GPU (printing the platform's reason). All passed on an H200
// (2026-11-26), also under compute-sanitizer memcheck.
#include <dlfcn.h>

#include <cmath>
#include <string>
#include <vector>

#include "megatron/platforms/cuda/cuda_kernels.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using platforms::cuda::RopeStats;
using test::make_tensor;
using test::to_doubles;

const Device kGpu = Device::cuda(0);

// rope.cu's entry points, looked up by their C names (this file also builds without CUDA).
RopeStats rope_stats() {
  using Fn = RopeStats (*)();
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "mg_cuda_rope_stats"));
  MG_CHECK(fn != nullptr, "mg_cuda_rope_stats is not in the process");
  return fn();
}
void rope_apply_with(Tensor& y, const Tensor& x, const ops::RopeArgs& a, bool backward,
                     bool force_scalar) {
  using Fn = void (*)(Tensor&, const Tensor&, const ops::RopeArgs&, bool, bool);
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "mg_cuda_rope_apply_with"));
  MG_CHECK(fn != nullptr, "mg_cuda_rope_apply_with is not in the process");
  fn(y, x, a, backward, force_scalar);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.raw_data());
  return std::vector<uint8_t>(p, p + h.numel() * static_cast<int64_t>(dtype_size(h.dtype())));
}

struct Case {
  int64_t s, b, h, hd;
  float percent = 1.0f;
  bool interleaved = false;
  int64_t offset = 0;
  std::vector<int64_t> pos = {};  // [S] or [B, S]; empty: s + offset
  bool pos_i32 = false;
  bool vector = true;  // whether the vector kernel serves it (bf16 / f16, aligned)
  Shape shape() const { return {s, b, h, hd}; }
  int64_t numel() const { return s * b * h * hd; }
};

ops::RopeArgs args_of(const Case& c, Device dev) {
  ops::RopeArgs a;
  a.rotary_percent = c.percent;
  a.interleaved = c.interleaved;
  a.position_offset = c.offset;
  if (!c.pos.empty()) {
    const Shape ps = static_cast<int64_t>(c.pos.size()) == c.s ? Shape{c.s} : Shape{c.b, c.s};
    a.position_ids = Tensor::from_vector(c.pos, ps, c.pos_i32 ? DType::i32 : DType::i64).to(dev);
  }
  return a;
}

std::vector<Case> cases() {
  Case per_batch{5, 3, 2, 64};
  // Positions outside the 4096-entry table: negative, just past it, far past it.
  per_batch.pos = {3, 1, 4, 1, 5, 90, 2, 6, 5, 3, 5, 8, -9, 4096, 100003};
  Case flat_i32{7, 2, 3, 64, 0.5f, true};
  flat_i32.pos = {0, 2, 4, 6, 8, 100, 1000};
  flat_i32.pos_i32 = true;
  Case flat_i32_plain = flat_i32;
  flat_i32_plain.interleaved = false;
  return {
      {7, 2, 4, 64},                      // Megatron's default form
      {7, 2, 4, 64, 1.0f, true},          // interleaved
      {9, 2, 3, 128, 0.5f, false, 4090},  // rot 64 of 128, an offset past 4096 - S
      {9, 2, 3, 128, 0.5f, true, 7},      // interleaved, rot 64 of 128
      {5, 1, 2, 48, 2.0f / 3.0f, true},   // interleaved rot 32 of 48 (48 % 16 != 0)
      {5, 2, 2, 16},                      // half = 8, the narrowest vector row
      per_batch,
      flat_i32,
      flat_i32_plain,
      // Not served by the vector kernel: half % 8 != 0, interleaved rot % 8 != 0.
      {4, 2, 2, 24, 1.0f, false, 0, {}, false, false},
      {4, 2, 2, 20, 1.0f, true, 0, {}, false, false},
  };
}

class CudaRopeVector : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaRopeVector, BitIdenticalToScalarKernel) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& cpu = test::ops_on("cpu");
  const DType dt = dtype();
  uint64_t seed = 11;
  for (const Case& c : cases())
    for (bool backward : {false, true})
      for (bool in_place : {false, true}) {
        const std::string what =
            std::string(backward ? "bwd" : "fwd") + (in_place ? " in place" : "") + " S " +
            std::to_string(c.s) + " B " + std::to_string(c.b) + " H " + std::to_string(c.h) +
            " HD " + std::to_string(c.hd) + " percent " + std::to_string(c.percent) +
            " interleaved " + std::to_string(c.interleaved) + " " + std::string(dtype_name(dt));
        SCOPED_TRACE(what);
        const auto a = args_of(c, kGpu);
        const auto x = make_tensor(test::random_values(c.numel(), seed++), c.shape(), dt, kGpu);
        // NaN-poisoned outputs: every element must be written (the pass-through ones too).
        const auto poison =
            make_tensor(std::vector<double>(static_cast<std::size_t>(c.numel()), std::nan("")),
                        c.shape(), dt, kGpu);
        Tensor yv = in_place ? x.t.clone() : poison.t.clone();
        Tensor ys = in_place ? x.t.clone() : poison.t.clone();
        const RopeStats before = rope_stats();
        rope_apply_with(yv, in_place ? yv : x.t, a, backward, false);
        const RopeStats mid = rope_stats();
        rope_apply_with(ys, in_place ? ys : x.t, a, backward, true);
        const RopeStats after = rope_stats();
        EXPECT_EQ(mid.vector_calls - before.vector_calls, c.vector ? 1u : 0u);
        EXPECT_EQ(after.scalar_calls - mid.scalar_calls, 1u);
        EXPECT_EQ(bytes_of(yv), bytes_of(ys));
        // And both right: the CPU op within the dtype's tolerance.
        Tensor yc = Tensor::empty(c.shape(), dt);
        const auto ac = args_of(c, Device::cpu());
        if (backward)
          cpu.rope_bwd(yc, x.t.to(Device::cpu()), ac);
        else
          cpu.rope_fwd(yc, x.t.to(Device::cpu()), ac);
        EXPECT_TRUE(test::all_close(to_doubles(yv), to_doubles(yc), test::tolerance(dt)));
      }
}

// A view 2 bytes past an aligned start is not 16-byte aligned: the scalar kernel, same bytes as
// the vector kernel on an aligned copy.
TEST_P(CudaRopeVector, MisalignedViewTakesTheScalarKernel) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  const Case c{6, 2, 2, 64};
  const auto a = args_of(c, kGpu);
  const auto flat = make_tensor(test::random_values(c.numel() + 1, 5), {c.numel() + 1}, dt, kGpu);
  const Tensor xm = flat.t.slice(1, c.numel()).view(c.shape());
  const Tensor xa = xm.clone();  // aligned
  Tensor ya = Tensor::empty(c.shape(), dt, kGpu);
  const auto& gpu = test::ops_on("cuda");
  const RopeStats before = rope_stats();
  gpu.rope_fwd(ya, xa, a);
  const RopeStats mid = rope_stats();
  Tensor ymm = flat.t.clone().slice(1, c.numel()).view(c.shape());  // misaligned output too
  gpu.rope_fwd(ymm, xm, a);
  const RopeStats after = rope_stats();
  EXPECT_EQ(mid.vector_calls - before.vector_calls, 1u);
  EXPECT_EQ(after.vector_calls - mid.vector_calls, 0u);
  EXPECT_EQ(after.scalar_calls - mid.scalar_calls, 1u);
  EXPECT_EQ(bytes_of(ymm), bytes_of(ya));
}

INSTANTIATE_TEST_SUITE_P(Half, CudaRopeVector, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaRopeTable, CachedPerKeyAndIndependentOfPositionIds) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  const auto& cpu = test::ops_on("cpu");
  const DType dt = DType::bf16;
  const int64_t s = 16, b = 2, nh = 4, ng = 2, hd = 64;
  // A base no other test uses, so that the first call is a miss whatever ran before.
  ops::RopeArgs a;
  a.base = 12345.0f;
  std::vector<int64_t> pos(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i % s);
  Tensor ids = Tensor::from_vector(pos, {b, s}, DType::i64, kGpu);
  a.position_ids = ids;
  const auto q = make_tensor(test::random_values(s * b * nh * hd, 1), {s, b, nh, hd}, dt, kGpu);
  const auto k = make_tensor(test::random_values(s * b * ng * hd, 2), {s, b, ng, hd}, dt, kGpu);
  Tensor qy = Tensor::empty(q.t.shape(), dt, kGpu), ky = Tensor::empty(k.t.shape(), dt, kGpu);

  RopeStats st0 = rope_stats();
  gpu.rope_fwd(qy, q.t, a);  // miss: builds the forward table
  gpu.rope_fwd(ky, k.t, a);  // the k call shares it
  RopeStats st1 = rope_stats();
  EXPECT_EQ(st1.table_misses - st0.table_misses, 1u);
  EXPECT_EQ(st1.table_hits - st0.table_hits, 1u);
  gpu.rope_bwd(qy, qy, a);  // miss: the backward's sign
  gpu.rope_bwd(ky, ky, a);
  RopeStats st2 = rope_stats();
  EXPECT_EQ(st2.table_misses - st1.table_misses, 1u);
  EXPECT_EQ(st2.table_hits - st1.table_hits, 1u);
  // The round trip gives x back within rounding.
  EXPECT_TRUE(test::all_close(to_doubles(qy), q.rounded, test::tolerance(dt)));

  // New ids of other content and another tensor: a hit, and the CPU's result.
  std::vector<int64_t> pos2(pos.size());
  for (std::size_t i = 0; i < pos2.size(); ++i) pos2[i] = static_cast<int64_t>(3 * i + 1);
  a.position_ids = Tensor::from_vector(pos2, {b, s}, DType::i64, kGpu);
  gpu.rope_fwd(qy, q.t, a);
  RopeStats st3 = rope_stats();
  EXPECT_EQ(st3.table_misses - st2.table_misses, 0u);
  ops::RopeArgs ac = a;
  ac.position_ids = Tensor::from_vector(pos2, {b, s}, DType::i64);
  Tensor qc = Tensor::empty(q.t.shape(), dt);
  cpu.rope_fwd(qc, q.t.to(Device::cpu()), ac);
  EXPECT_TRUE(test::all_close(to_doubles(qy), to_doubles(qc), test::tolerance(dt)));
  // The same ids tensor overwritten in place: still right (nothing is cached by content).
  a.position_ids.copy_(Tensor::from_vector(pos, {b, s}, DType::i64));
  ac.position_ids = Tensor::from_vector(pos, {b, s}, DType::i64);
  gpu.rope_fwd(qy, q.t, a);
  cpu.rope_fwd(qc, q.t.to(Device::cpu()), ac);
  EXPECT_TRUE(test::all_close(to_doubles(qy), to_doubles(qc), test::tolerance(dt)));

  // Other rot, scaling, base: other tables.
  ops::RopeArgs half_rot = a;
  half_rot.rotary_percent = 0.5f;
  ops::RopeArgs scaled = a;
  scaled.scaling.type = ops::RopeScalingType::linear;
  scaled.scaling.factor = 4.0;
  const RopeStats st4 = rope_stats();
  gpu.rope_fwd(qy, q.t, half_rot);
  gpu.rope_fwd(qy, q.t, scaled);
  gpu.rope_fwd(ky, k.t, scaled);
  const RopeStats st5 = rope_stats();
  EXPECT_EQ(st5.table_misses - st4.table_misses, 2u);
  EXPECT_EQ(st5.table_hits - st4.table_hits, 1u);
  ops::RopeArgs sc = scaled;
  sc.position_ids = ac.position_ids;
  cpu.rope_fwd(qc, q.t.to(Device::cpu()), sc);
  gpu.rope_fwd(qy, q.t, scaled);
  EXPECT_TRUE(test::all_close(to_doubles(qy), to_doubles(qc), test::tolerance(dt)));

  // Twelve more bases: evictions keep at most 8 tables; the evicted key is rebuilt and right.
  for (int i = 0; i < 12; ++i) {
    ops::RopeArgs o = a;
    o.base = 20000.0f + static_cast<float>(i);
    gpu.rope_fwd(ky, k.t, o);
  }
  const RopeStats st6 = rope_stats();
  EXPECT_LE(st6.tables, 8u);
  gpu.rope_fwd(qy, q.t, a);
  EXPECT_EQ(rope_stats().table_misses - st6.table_misses, 1u);
  cpu.rope_fwd(qc, q.t.to(Device::cpu()), ac);
  EXPECT_TRUE(test::all_close(to_doubles(qy), to_doubles(qc), test::tolerance(dt)));
}

// Without position ids the table covers [0, S + offset) rounded up: a decode step at a larger
// offset than any table covers builds a larger one, later steps below it hit.
TEST(CudaRopeTable, OffsetsGrowTheTable) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const auto& gpu = test::ops_on("cuda");
  const auto& cpu = test::ops_on("cpu");
  const DType dt = DType::f32;
  const int64_t hd = 32;
  ops::RopeArgs a;
  a.base = 54321.0f;
  const auto x = make_tensor(test::random_values(3 * hd, 3), {1, 1, 3, hd}, dt, kGpu);
  Tensor y = Tensor::empty(x.t.shape(), dt, kGpu), yc = Tensor::empty(x.t.shape(), dt);
  for (int64_t off : {0, 4095, 4096, 5000, 8191}) {
    a.position_offset = off;
    const RopeStats before = rope_stats();
    gpu.rope_fwd(y, x.t, a);
    const RopeStats after = rope_stats();
    // 0 and 4095 fit the first 4096-position table, 4096 needs 8192, the rest fit that.
    const uint64_t misses = (off == 0 || off == 4096) ? 1u : 0u;
    EXPECT_EQ(after.table_misses - before.table_misses, misses) << "offset " << off;
    ops::RopeArgs ac = a;
    cpu.rope_fwd(yc, x.t.to(Device::cpu()), ac);
    EXPECT_TRUE(test::all_close(to_doubles(y), to_doubles(yc), test::tolerance(dt)))
        << "offset " << off;
  }
}

}  // namespace
}  // namespace mg
