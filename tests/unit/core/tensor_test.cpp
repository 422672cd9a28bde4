// Tests of the host Tensor (megatron/core/tensor/tensor.h): construction, views (view / slice /
// select share storage at the right byte offset), conversions (copy_, to, clone), error messages
// that name the offending shape, and the host allocator's statistics.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "megatron/plugin/platform.h"
#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;

std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = float(i);
  return v;
}

class TensorTest : public ::testing::Test {
 protected:
  void SetUp() override { mg::test::ensure_runtime(); }
};

TEST_F(TensorTest, EmptyZerosFromVector) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_EQ(u.str(), "Tensor(undefined)");
  EXPECT_THROW(u.raw_data(), mg::Error);

  Tensor e = Tensor::empty({2, 3, 5}, DType::bf16);
  EXPECT_TRUE(e.defined());
  EXPECT_EQ(e.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(e.dim(), 3);
  EXPECT_EQ(e.numel(), 30);
  EXPECT_EQ(e.nbytes(), 60u);
  EXPECT_EQ(e.size(-1), 5);
  EXPECT_EQ(e.size(0), 2);
  EXPECT_TRUE(e.is_host());
  EXPECT_EQ(e.str(), "Tensor(bf16, [2, 3, 5], cpu)");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(e.raw_data()) % 256, 0u);  // allocator alignment

  Tensor z = Tensor::zeros({7}, DType::f64);
  EXPECT_EQ(z.to_vector<double>(), std::vector<double>(7, 0.0));

  Tensor f = Tensor::from_vector(std::vector<double>{1.5, -2.25, 3.0}, {3}, DType::f16);
  EXPECT_EQ(f.dtype(), DType::f16);
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{1.5, -2.25, 3.0}));
  Tensor g = Tensor::from_vector(std::vector<int32_t>{4, 5}, {2});
  EXPECT_EQ(g.dtype(), DType::i32);
  EXPECT_EQ(g.data<int32_t>()[1], 5);

  Tensor scalar_like = Tensor::zeros({0, 4}, DType::f32);
  EXPECT_EQ(scalar_like.numel(), 0);
}

TEST_F(TensorTest, ErrorsNameTheShape) {
  std::string m = mg::test::error_message([] {
    Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2});
  });
  EXPECT_NE(m.find("[2, 2]"), std::string::npos) << m;
  EXPECT_NE(m.find("3 values"), std::string::npos) << m;
  m = mg::test::error_message([] { Tensor::empty({3, -2}, DType::f32); });
  EXPECT_NE(m.find("[3, -2]"), std::string::npos) << m;
  Tensor t = Tensor::zeros({4, 6}, DType::f32);
  m = mg::test::error_message([&] { t.view({5, 5}); });
  EXPECT_NE(m.find("[5, 5]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
  m = mg::test::error_message([&] { t.view({-1, 5}); });
  EXPECT_NE(m.find("[-1, 5]"), std::string::npos) << m;
  m = mg::test::error_message([&] { t.view({-1, -1}); });
  EXPECT_NE(m.find("more than one -1"), std::string::npos) << m;
  m = mg::test::error_message([&] { t.slice(3, 2); });
  EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
  m = mg::test::error_message([&] { t.size(2); });
  EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
  m = mg::test::error_message([&] { t.data<double>(); });
  EXPECT_NE(m.find("f32"), std::string::npos) << m;
  Tensor small = Tensor::zeros({5}, DType::f32);
  m = mg::test::error_message([&] { t.copy_(small); });
  EXPECT_NE(m.find("[5]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
}

TEST_F(TensorTest, ViewInfersMinusOneAndSharesStorage) {
  Tensor t = Tensor::from_vector(iota(24), {4, 6});
  Tensor v = t.view({2, -1, 3});
  EXPECT_EQ(v.shape(), (Shape{2, 4, 3}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(v.raw_data(), t.raw_data());
  EXPECT_EQ(t.view({-1}).shape(), (Shape{24}));
  v.data<float>()[23] = 100.0f;
  EXPECT_EQ(t.to_vector<float>()[23], 100.0f);
}

TEST_F(TensorTest, SliceAndSelectOffsetsShareStorage) {
  Tensor t = Tensor::from_vector(iota(5 * 3 * 2), {5, 3, 2}, DType::f64);
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{3, 3, 2}));
  EXPECT_EQ(s.offset_bytes(), 1u * 6u * 8u);
  EXPECT_TRUE(s.shares_storage_with(t));
  EXPECT_EQ(s.to_vector<float>()[0], 6.0f);
  Tensor r = s.select(2);  // row 3 of t
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.offset_bytes(), 3u * 6u * 8u);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{18, 19, 20, 21, 22, 23}));
  r.data<double>()[0] = -1.0;  // writes through to the parent
  EXPECT_EQ(t.to_vector<double>()[18], -1.0);
  Tensor inner = t.select(4).select(1);  // nested: [2] at element 4*6 + 1*2
  EXPECT_EQ(inner.offset_bytes(), (4u * 6u + 2u) * 8u);
  EXPECT_EQ(inner.to_vector<double>(), (std::vector<double>{26, 27}));
  EXPECT_EQ(t.slice(5, 0).numel(), 0);
}

TEST_F(TensorTest, CopyAndToAcrossDtypes) {
  const std::vector<double> vals = {1.0, -0.5, 3.140625, 1000.0, -7.75};
  Tensor f32 = Tensor::from_vector(vals, {5}, DType::f32);
  for (DType dt : {DType::f64, DType::bf16, DType::f16, DType::fp8_e4m3, DType::i32}) {
    Tensor c = Tensor::empty({5}, dt);
    c.copy_(f32);
    Tensor via_to = f32.to(dt);
    EXPECT_FALSE(via_to.shares_storage_with(f32));
    EXPECT_EQ(via_to.dtype(), dt);
    // copy_ and to() convert alike, bit for bit (NaN included).
    EXPECT_EQ(std::memcmp(c.raw_data(), via_to.raw_data(), c.nbytes()), 0) << dtype_name(dt);
  }
  EXPECT_EQ(f32.to(DType::bf16).to_vector<double>(),
            (std::vector<double>{1.0, -0.5, 3.140625, 1000.0, -7.75}));  // all exact in bf16
  EXPECT_EQ(f32.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 3, 1000, -7}));
  // 1000 is beyond e4m3's 448: NaN (non-saturating cast); the others round to e4m3 values.
  const auto e4m3 = f32.to(DType::fp8_e4m3).to_vector<double>();
  EXPECT_TRUE(std::isnan(e4m3[3]));
  EXPECT_EQ(e4m3[2], 3.25);  // 3.140625: nearest of 3.0 / 3.25 (step 0.25)
  Tensor same = f32.to(DType::f32);
  EXPECT_TRUE(same.shares_storage_with(f32));  // no-op conversion returns *this
  EXPECT_TRUE(f32.to(mg::Device::cpu()).shares_storage_with(f32));
  // copy_ between different shapes with the same element count is allowed (flat copy).
  Tensor flat = Tensor::empty({5, 1}, DType::f64);
  flat.copy_(f32);
  EXPECT_EQ(flat.to_vector<double>(), vals);
}

TEST_F(TensorTest, CloneIsIndependent) {
  Tensor t = Tensor::from_vector(iota(6), {2, 3});
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.shape(), t.shape());
  c.data<float>()[0] = 42.0f;
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  t.zero_();
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{42, 1, 2, 3, 4, 5}));
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(6, 0.0f));
  Tensor part = Tensor::from_vector(iota(6), {3, 2}).slice(1, 2).clone();  // clone of a view
  EXPECT_EQ(part.offset_bytes(), 0u);
  EXPECT_EQ(part.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
}

TEST_F(TensorTest, HostAllocatorStats) {
  mg::plugin::Allocator& a = mg::plugin::host_allocator();
  const auto s0 = a.stats();
  {
    Tensor t = Tensor::empty({1000}, DType::f32);
    const auto s1 = a.stats();
    EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes + 4000);
    EXPECT_EQ(s1.num_allocs, s0.num_allocs + 1);
    EXPECT_GE(s1.peak_allocated_bytes, s1.allocated_bytes);
    EXPECT_GE(s1.reserved_bytes, s1.allocated_bytes);
    Tensor v = t.view({10, 100}).slice(2, 3);  // views allocate nothing
    EXPECT_EQ(a.stats().num_allocs, s1.num_allocs);
    {
      Tensor big = Tensor::empty({1 << 20}, DType::f64);  // 8 MiB
      EXPECT_GE(a.stats().peak_allocated_bytes, s0.allocated_bytes + 4000 + (8u << 20));
    }
    const auto s2 = a.stats();
    EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes + 4000);
    EXPECT_EQ(s2.num_frees, s1.num_frees + 1);
    EXPECT_GE(s2.peak_allocated_bytes, s0.allocated_bytes + 4000 + (8u << 20));  // peak stays
    a.reset_peak();
    EXPECT_EQ(a.stats().peak_allocated_bytes, s2.allocated_bytes);
  }
  // t and its view released together: one free when the last view dies.
  const auto s3 = a.stats();
  EXPECT_EQ(s3.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s3.num_frees, s0.num_frees + 2);
}

}  // namespace
