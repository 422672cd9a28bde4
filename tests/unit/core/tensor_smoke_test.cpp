#include "tests/unit/test_util.h"

TEST(TensorSmoke, ViewSliceAndConvert) {
  mg::test::ensure_runtime();
  auto t = mg::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  auto s = t.slice(1, 2);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(t.to(mg::DType::bf16).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
}
