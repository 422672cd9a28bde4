// Backend selection and the single-rank backend: init_communicator's choices and errors, size-1
// groups whose collectives are copies with the same checks as every backend, sends to self, and
// new_groups on a world of one. (The collectives themselves: collectives_test.cpp.)
#include "megatron/core/comm/process_group.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace mg::comm {
namespace {

// An mg::Error as MG_CHECK throws it: abort_on_error prints its message, without the location.
Error check_error_for_test() {
  try {
    MG_CHECK(false, "boom " << 42);
  } catch (const Error& e) {
    return e;
  }
  return Error("", "", "", 0);
}

TEST(InitCommunicator, SingleBackendIsAWorldOfOne) {
  auto c = init_communicator("single");
  EXPECT_EQ(c->backend(), "single");
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->world_rank(), 0);
  auto w = c->world();
  EXPECT_EQ(w->name(), "world");
  EXPECT_EQ(w->backend(), "single");
  EXPECT_EQ(w->ranks(), std::vector<int>{0});
  EXPECT_EQ(c->default_timeout(), kDefaultTimeout);
}

TEST(InitCommunicator, AutoWithoutLauncherIsSingle) {
  if (launched_by_mpi_launcher()) GTEST_SKIP() << "started by an MPI launcher";
  EXPECT_EQ(init_communicator("")->backend(), "single");
}

TEST(InitCommunicator, UnknownBackendListsTheValidOnes) {
  try {
    init_communicator("gloo");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("'gloo'"), std::string::npos) << m;
    EXPECT_NE(m.find("single"), std::string::npos) << m;
  }
  const auto names = available_backends();
  EXPECT_EQ(names.front(), "single");
}

TEST(InitCommunicator, RegisteredBackendIsCreatedByName) {
  register_communicator_backend("fake", [] { return init_communicator("single"); });
  EXPECT_EQ(init_communicator("fake")->backend(), "single");
  const auto names = available_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "fake"), names.end());
  EXPECT_THROW(register_communicator_backend("mpi", [] { return init_communicator("single"); }),
               Error);
}

TEST(AbortOnError, OneLineAndExitOneWithoutMpi) {
  if (launched_by_mpi_launcher()) GTEST_SKIP() << "started by an MPI launcher";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(abort_on_error(check_error_for_test(), "tool"), ::testing::ExitedWithCode(1),
              "^tool: error: boom 42\n$");
  EXPECT_EXIT(abort_on_error(std::runtime_error("plain"), "tool"), ::testing::ExitedWithCode(1),
              "tool: error: plain");
}

TEST(SingleBackend, CollectivesAreCopies) {
  auto c = init_communicator("single");
  auto& g = *c->world();
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  g.all_reduce(x, ReduceOp::avg)->wait();
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor out = Tensor::zeros({3}, DType::f32);
  EXPECT_TRUE(g.all_gather(out, x)->is_completed());
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor rs = Tensor::zeros({3}, DType::f32);
  g.reduce_scatter(rs, x)->wait();
  EXPECT_EQ(rs.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor a2a = Tensor::zeros({3}, DType::f32);
  g.all_to_all(a2a, x)->wait();
  EXPECT_EQ(a2a.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor v = Tensor::zeros({4}, DType::f32);
  const std::vector<int64_t> two{2};
  g.all_to_all_v(v, x, two, two)->wait();
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1, 2, 0, 0}));
  g.broadcast(x, 0)->wait();
  g.barrier();
  // The checks are the same as on every backend.
  EXPECT_THROW(g.broadcast(x, 1), Error);
  Tensor wrong = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(g.all_gather(wrong, x), Error);
  Tensor wrong_type = Tensor::zeros({3}, DType::bf16);
  EXPECT_THROW(g.reduce_scatter(wrong_type, x), Error);
  EXPECT_THROW(g.all_to_all_v(v, x, two, std::vector<int64_t>{1}), Error);
}

TEST(SingleBackend, SendToSelfIsMatchedByTag) {
  auto c = init_communicator("single");
  auto& g = *c->world();
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  Tensor b = Tensor::from_vector(std::vector<float>{3, 4}, {2});
  g.send(a, 0, 1)->wait();
  g.send(b, 0, 2)->wait();
  Tensor r = Tensor::zeros({2}, DType::f32);
  g.recv(r, 0, 2)->wait();
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{3, 4}));
  g.recv(r, 0, 1)->wait();
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1, 2}));
  try {
    g.recv(r, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("wait forever"), std::string::npos) << e.message();
  }
  Tensor ring = Tensor::zeros({2}, DType::f32);
  std::vector<P2POp> ops{{P2POp::Kind::recv, ring, 0, 0}, {P2POp::Kind::send, a, 0, 0}};
  g.batch_isend_irecv(ops)->wait();
  EXPECT_EQ(ring.to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(SingleBackend, NewGroups) {
  auto c = init_communicator("single");
  auto tp = c->new_groups({{0}}, "tp");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(c->new_groups({}, "none"), nullptr);
  EXPECT_THROW(c->new_groups({{0, 1}}, "tp"), Error);
  EXPECT_THROW(c->new_groups({{}}, "tp"), Error);
}

}  // namespace
}  // namespace mg::comm
