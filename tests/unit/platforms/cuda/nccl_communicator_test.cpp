// The NCCL backend on one GPU (a world of one rank): every op on device tensors, the results read
// back on the compute stream after Work::wait(), new_groups, barrier, the watchdog's abort of an op
// past its timeout. Skips without a GPU, and when the build has no NCCL ("nccl" not among the
// backends). Multi-GPU runs need one GPU per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "megatron/core/comm/process_group.h"
#include "tests/unit/test_util.h"

namespace mg::comm {
namespace {

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::ensure_runtime();
    MG_SKIP_IF_UNAVAILABLE("cuda");
    const auto names = available_backends();
    if (std::find(names.begin(), names.end(), "nccl") == names.end())
      GTEST_SKIP() << "this build has no NCCL";
    if (!comm_) comm_ = init_communicator("nccl");
  }
  static void TearDownTestSuite() { comm_.reset(); }  // before CUDA tears down at exit
  static std::unique_ptr<Communicator> comm_;
};
std::unique_ptr<Communicator> NcclTest::comm_;

Tensor dev(const std::vector<float>& v, DType dt = DType::f32) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dt).to(Device::cuda(0));
}

TEST_F(NcclTest, WorldOfOneOnDeviceTensors) {
  auto g = comm_->world();
  EXPECT_EQ(g->backend(), "nccl");
  EXPECT_EQ(g->size(), 1);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor x = dev({1, 2, 3, 4}, dt);
    g->all_reduce(x, ReduceOp::avg)->wait();
    EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3, 4})) << dtype_name(dt);
  }
  Tensor in = dev({5, 6}), out = dev({0, 0});
  g->all_gather(out, in)->wait();
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{5, 6}));
  Tensor rs = dev({0, 0});
  g->reduce_scatter(rs, in, ReduceOp::max)->wait();
  EXPECT_EQ(rs.to_vector<float>(), (std::vector<float>{5, 6}));
  Tensor a2a = dev({0, 0});
  g->all_to_all(a2a, in)->wait();
  EXPECT_EQ(a2a.to_vector<float>(), (std::vector<float>{5, 6}));
  Tensor v = dev({0, 0, 0});
  const std::vector<int64_t> one{1};
  g->all_to_all_v(v, in, one, one)->wait();
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{5, 0, 0}));
  Tensor r = dev({0, 0});
  std::vector<P2POp> ops{{P2POp::Kind::send, in, 0, 0}, {P2POp::Kind::recv, r, 0, 0}};
  g->batch_isend_irecv(ops)->wait();
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{5, 6}));
  g->barrier();
  // Host tensors are refused with a message naming the backend's device.
  Tensor host = Tensor::zeros({2}, DType::f32);
  EXPECT_THROW(g->all_reduce(host), Error);
}

TEST_F(NcclTest, NewGroupsSplitsTheWorld) {
  auto tp = comm_->new_groups({{0}}, "tp");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp");
  Tensor x = dev({3});
  tp->all_reduce(x)->wait();
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{3}));
}

// The watchdog (nccl_communicator.cpp): an op that never completes (a receive from this rank with
// no matching send) is aborted past the group's timeout, and its wait() and every later op on the
// communicator throw naming the reason. Its own communicator (the aborted one is unusable); last
// in this file, so that a NCCL that did not release the stuck kernel costs this test only.
TEST_F(NcclTest, WatchdogAbortsAnOpPastItsTimeout) {
  using namespace std::chrono_literals;
  auto c = init_communicator("nccl");
  auto g = c->world();
  g->set_timeout(300ms);
  Tensor x = dev({0, 0});
  WorkPtr w;
  try {
    w = g->recv(x, 0, 0);
  } catch (const Error& e) {
    GTEST_SKIP() << "this NCCL refuses an unmatched receive from the same rank at launch: "
                 << e.message();
  }
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  while (message.empty() && std::chrono::steady_clock::now() - start < 30s) {
    try {
      ASSERT_FALSE(w->is_completed()) << "a receive without a send completed";
    } catch (const Error& e) {
      message = e.message();
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(message.find("did not finish within 300 ms"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the watchdog was late";
  EXPECT_THROW(w->wait(), Error);
  Tensor y = dev({1});
  try {
    g->all_reduce(y);
    ADD_FAILURE() << "an op on the aborted communicator was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("aborted"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace mg::comm
