// Every ProcessGroup collective against a locally computed expectation, for any world size: run as
// an ordinary unit test it covers the single-rank backend; tests/CMakeLists.txt also runs it under
// `mpirun -np 2, 3, 4` (CTest label `mpi`), where it covers the MPI backend. Inputs are a function
// of (global rank, element), so each rank computes what every collective must give. Values are
// small integers where sums must be exact in bf16; a random-float test checks that a reduction is
// bit-identical on every rank. A 20 s group timeout turns a hang into a failure.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "megatron/core/comm/backends.h"
#include "megatron/core/comm/process_group.h"

namespace mg::comm {
namespace {

using namespace std::chrono_literals;

Communicator& comm() {
  static std::unique_ptr<Communicator> c = [] {
    auto p = init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}

ProcessGroup& world() {
  return *comm().world();
}

// Element i of member `rank`'s input: a small integer, exact in every dtype tested.
double value(int rank, int64_t i) {
  return static_cast<double>((rank * 7 + i * 3) % 11) - 5.0;
}

Tensor make(DType dt, const Shape& shape, int rank, int64_t offset = 0) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(rank, offset + static_cast<int64_t>(i));
  return Tensor::from_vector(v, shape, dt);
}

// x rounded to dt, as the backend stores it.
double round_to(DType dt, double x) {
  return Tensor::from_vector(std::vector<double>{x}, {1}, dt).to_vector<double>()[0];
}

// The expected avg: the exact sum, divided once in the reduction type (f64 for f64, f32 else).
double avg_of(DType dt, double sum, int n) {
  if (dt == DType::f64) return sum / n;
  return round_to(dt, static_cast<double>(static_cast<float>(sum) / static_cast<float>(n)));
}

class CollectiveTest : public ::testing::TestWithParam<DType> {};

TEST_P(CollectiveTest, AllReduceSumAvgMaxMin) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    if (op == ReduceOp::avg && !is_floating(dt)) continue;
    Tensor x = make(dt, {5, 3}, g.rank());
    g.all_reduce(x, op)->wait();
    const auto got = x.to_vector<double>();
    for (int64_t i = 0; i < 15; ++i) {
      double sum = 0, mx = -1e9, mn = 1e9;
      for (int r = 0; r < n; ++r) {
        sum += value(r, i);
        mx = std::max(mx, value(r, i));
        mn = std::min(mn, value(r, i));
      }
      const double want = op == ReduceOp::sum   ? sum
                          : op == ReduceOp::avg ? avg_of(dt, sum, n)
                          : op == ReduceOp::max ? mx
                                                : mn;
      ASSERT_EQ(got[static_cast<std::size_t>(i)], want)
          << "op " << reduce_op_name(op) << " element " << i << " on rank " << g.rank();
    }
  }
}

TEST_P(CollectiveTest, AllGather) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  Tensor in = make(dt, {2, 3}, g.rank());
  Tensor out = Tensor::zeros({2 * g.size(), 3}, dt);
  g.all_gather(out, in)->wait();
  const auto got = out.to_vector<double>();
  for (int r = 0; r < g.size(); ++r) {
    for (int64_t i = 0; i < 6; ++i) ASSERT_EQ(got[r * 6 + i], value(r, i)) << "chunk " << r;
  }
  // In place: in is this member's chunk of out.
  Tensor buf = Tensor::zeros({g.size() * 4}, dt);
  buf.slice(g.rank() * 4, 4).copy_(make(dt, {4}, g.rank()));
  g.all_gather(buf, buf.slice(g.rank() * 4, 4))->wait();
  const auto got2 = buf.to_vector<double>();
  for (int r = 0; r < g.size(); ++r) {
    for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(got2[r * 4 + i], value(r, i)) << "in place " << r;
  }
}

TEST_P(CollectiveTest, ReduceScatter) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    if (op == ReduceOp::avg && !is_floating(dt)) continue;
    Tensor in = make(dt, {2 * n, 3}, g.rank());
    Tensor out = Tensor::zeros({2, 3}, dt);
    g.reduce_scatter(out, in, op)->wait();
    const auto got = out.to_vector<double>();
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t e = g.rank() * 6 + i;  // element of the full input this member receives
      double sum = 0, mx = -1e9;
      for (int r = 0; r < n; ++r) {
        sum += value(r, e);
        mx = std::max(mx, value(r, e));
      }
      const double want = op == ReduceOp::sum ? sum : op == ReduceOp::avg ? avg_of(dt, sum, n) : mx;
      ASSERT_EQ(got[static_cast<std::size_t>(i)], want) << reduce_op_name(op) << " element " << i;
    }
    // Overlapping: out is this member's chunk of in (the distributed optimizer's layout).
    Tensor buf = make(dt, {2 * n, 3}, g.rank());
    Tensor mine = buf.slice(2 * g.rank(), 2);
    g.reduce_scatter(mine, buf, op)->wait();
    EXPECT_EQ(mine.to_vector<double>(), got) << "in-place " << reduce_op_name(op);
  }
}

TEST_P(CollectiveTest, BroadcastFromEveryRoot) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  for (int root = 0; root < g.size(); ++root) {
    Tensor x = make(dt, {7}, g.rank());
    g.broadcast(x, root)->wait();
    EXPECT_EQ(x.to_vector<double>(), make(dt, {7}, root).to_vector<double>()) << "root " << root;
  }
}

TEST_P(CollectiveTest, AllToAll) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  Tensor in = make(dt, {n * 2, 2}, g.rank());  // chunk j (4 elements) goes to member j
  Tensor out = Tensor::zeros({n * 2, 2}, dt);
  g.all_to_all(out, in)->wait();
  const auto got = out.to_vector<double>();
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < 4; ++k) {
      ASSERT_EQ(got[j * 4 + k], value(j, g.rank() * 4 + k)) << "from member " << j;
    }
  }
}

TEST_P(CollectiveTest, AllToAllVWithZeroCounts) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  auto count = [](int from, int to) -> int64_t { return (2 * from + to) % 3; };  // zeros included
  std::vector<int64_t> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
  int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < n; ++j) {
    send[static_cast<std::size_t>(j)] = count(me, j);
    recv[static_cast<std::size_t>(j)] = count(j, me);
    send_total += count(me, j);
    recv_total += count(j, me);
  }
  // Element k of the block member `from` sends to member `to`: a value unique to (from, to, k).
  auto elem = [](int from, int to, int64_t k) { return value(from, 10 * to + k); };
  std::vector<double> v;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < count(me, j); ++k) v.push_back(elem(me, j, k));
  }
  v.push_back(99);  // unsent tail: counts may total less than the tensor
  Tensor in = Tensor::from_vector(v, {send_total + 1}, dt);
  Tensor out = Tensor::zeros({recv_total + 1}, dt);
  g.all_to_all_v(out, in, send, recv)->wait();
  const auto got = out.to_vector<double>();
  std::size_t p = 0;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < count(j, me); ++k, ++p) {
      ASSERT_EQ(got[p], round_to(dt, elem(j, me, k))) << "from member " << j << " element " << k;
    }
  }
  EXPECT_EQ(got[p], 0.0) << "element past the received counts was written";
}

INSTANTIATE_TEST_SUITE_P(DTypes, CollectiveTest,
                         ::testing::Values(DType::f32, DType::bf16, DType::f64, DType::i64,
                                           DType::f16, DType::i32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Collectives, RandomFloatSumIsBitIdenticalOnEveryRank) {
  ProcessGroup& g = world();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{17}, int64_t{100003}}) {  // small and large: different algorithms
      std::mt19937 gen(1234 + 17 * static_cast<unsigned>(g.rank()));
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& f : v) f = d(gen);
      Tensor x = Tensor::from_vector(v, {n}, dt);
      Tensor again = x.clone();
      g.all_reduce(x, ReduceOp::sum)->wait();
      g.all_reduce(again, ReduceOp::sum)->wait();
      Tensor all = Tensor::zeros({g.size() * n}, dt);
      g.all_gather(all, x)->wait();
      const auto mine = x.to_vector<float>();
      EXPECT_EQ(again.to_vector<float>(), mine) << "not deterministic across calls";
      const auto every = all.to_vector<float>();
      for (int r = 0; r < g.size(); ++r) {
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(every[r * n + i], mine[static_cast<std::size_t>(i)])
              << dtype_name(dt) << " n " << n << ": rank " << r << " differs at " << i;
        }
      }
      // Close to the exact sum (computed from every rank's regenerated input).
      std::vector<double> exact(static_cast<std::size_t>(n), 0.0);
      for (int r = 0; r < g.size(); ++r) {
        std::mt19937 gr(1234 + 17 * static_cast<unsigned>(r));
        for (int64_t i = 0; i < n; ++i) {
          exact[static_cast<std::size_t>(i)] +=
              Tensor::from_vector(std::vector<float>{d(gr)}, {1}, dt).to_vector<double>()[0];
          if (n > 1000 && i > 200) break;
        }
      }
      const double tol = dt == DType::f32 ? 1e-5 : 2e-2 * g.size();
      for (int64_t i = 0; i < std::min<int64_t>(n, 200); ++i) {
        ASSERT_NEAR(mine[static_cast<std::size_t>(i)], exact[static_cast<std::size_t>(i)], tol);
      }
    }
  }
}

TEST(Collectives, BatchedP2PRing) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    Tensor send = make(dt, {3, 4}, me);
    Tensor recv = Tensor::zeros({3, 4}, dt);
    Tensor send2 = make(dt, {5}, me, 100);
    Tensor recv2 = Tensor::zeros({5}, dt);
    std::vector<P2POp> ops{{P2POp::Kind::send, send, next, 0},
                           {P2POp::Kind::recv, recv, prev, 0},
                           {P2POp::Kind::send, send2, prev, 1},
                           {P2POp::Kind::recv, recv2, next, 1}};
    g.batch_isend_irecv(ops)->wait();
    EXPECT_EQ(recv.to_vector<double>(), make(dt, {3, 4}, prev).to_vector<double>());
    EXPECT_EQ(recv2.to_vector<double>(), make(dt, {5}, next, 100).to_vector<double>());
  }
  // Plain send/recv, even ranks first, so blocking order cannot deadlock.
  Tensor a = make(DType::f32, {4}, me), b = Tensor::zeros({4}, DType::f32);
  if (me % 2 == 0) {
    auto s = g.send(a, next, 7);
    g.recv(b, prev, 7)->wait();
    s->wait();
  } else {
    g.recv(b, prev, 7)->wait();
    g.send(a, next, 7)->wait();
  }
  EXPECT_EQ(b.to_vector<float>(), make(DType::f32, {4}, prev).to_vector<float>());
  g.barrier();
}

TEST(Collectives, RecvOfAShorterMessageIsAnError) {
  ProcessGroup& g = world();
  if (g.size() < 2) GTEST_SKIP() << "needs two ranks (run under mpirun)";
  const int n = g.size(), me = g.rank();
  Tensor small = Tensor::zeros({3}, DType::f32), big = Tensor::zeros({4}, DType::f32);
  auto s = g.send(small, (me + 1) % n, 3);
  try {
    g.recv(big, (me + n - 1) % n, 3)->wait();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("received 3 elements"), std::string::npos) << e.message();
  }
  s->wait();
  g.barrier();
}

// A launched all-reduce completes while its caller makes no MPI call (the progress thread tests
// it): what --overlap-grad-reduce needs so a bucket's reduction runs during the rest of backward.
// 16 MiB is far above OpenMPI's eager limit, so without progress the transfer would not advance.
TEST(Collectives, LaunchedAllReduceAdvancesWithoutWait) {
  ProcessGroup& g = world();
  if (g.size() < 2) GTEST_SKIP() << "needs two ranks (run under mpirun)";
  if (!detail::mpi_progress_thread_on())
    GTEST_SKIP() << "the MPI progress thread is off (MG_MPI_PROGRESS_THREAD=0 or MPI without "
                    "MPI_THREAD_MULTIPLE)";
  const int64_t n = int64_t{1} << 22;
  Tensor x = make(DType::f32, {n}, g.rank());
  g.barrier();
  const int64_t before = detail::mpi_background_completions();
  WorkPtr w = g.all_reduce(x);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (detail::mpi_background_completions() == before &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);  // no MPI call on this thread meanwhile
  EXPECT_GT(detail::mpi_background_completions(), before);
  w->wait();
  const auto v = x.to_vector<float>();
  for (int64_t i : {int64_t{0}, int64_t{1}, n / 2, n - 1}) {
    double sum = 0.0;
    for (int r = 0; r < g.size(); ++r) sum += value(r, i);
    ASSERT_EQ(v[static_cast<std::size_t>(i)], static_cast<float>(sum)) << "element " << i;
  }
  g.barrier();
}

TEST(Collectives, NewGroupsSplitsAndOrders) {
  Communicator& c = comm();
  const int n = c.world_size(), me = c.world_rank();
  // Even and odd ranks, each group listed in reverse: group order is the order given.
  std::vector<std::vector<int>> parity(2);
  for (int r = n - 1; r >= 0; --r) parity[static_cast<std::size_t>(r % 2)].push_back(r);
  if (parity[1].empty()) parity.pop_back();
  auto g = c.new_groups(parity, "parity");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->name(), "parity");
  const auto& mine = parity[static_cast<std::size_t>(me % 2)];
  EXPECT_EQ(g->ranks(), mine);
  EXPECT_EQ(g->size(), static_cast<int>(mine.size()));
  ASSERT_EQ(g->ranks()[static_cast<std::size_t>(g->rank())], me);
  Tensor x = Tensor::from_vector(std::vector<double>{1.0 * me, 1.0}, {2}, DType::f64);
  g->all_reduce(x)->wait();
  double sum = 0;
  for (int r : mine) sum += r;
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{sum, 1.0 * mine.size()}));
  Tensor out = Tensor::zeros({g->size()}, DType::f64);
  g->all_gather(out, Tensor::from_vector(std::vector<double>{1.0 * me}, {1}, DType::f64))->wait();
  std::vector<double> want(mine.begin(), mine.end());
  EXPECT_EQ(out.to_vector<double>(), want);

  // A partition that leaves the last rank out: it gets no group.
  std::vector<int> head;
  for (int r = 0; r + 1 < n; ++r) head.push_back(r);
  std::vector<std::vector<int>> head_groups;
  if (!head.empty()) head_groups.push_back(head);
  auto h = c.new_groups(head_groups, "head");
  EXPECT_EQ(h == nullptr, me == n - 1);
  if (h) {
    Tensor y = Tensor::from_vector(std::vector<float>{1.0f}, {1}, DType::f32);
    h->all_reduce(y)->wait();
    EXPECT_EQ(y.to_vector<float>()[0], static_cast<float>(n - 1));
  }
}

TEST(Collectives, SizeMismatchNamesOpGroupAndShapes) {
  ProcessGroup& g = world();
  Tensor in = Tensor::zeros({2, 3}, DType::f32);
  Tensor out = Tensor::zeros({2 * g.size() + 1, 3}, DType::f32);
  try {
    g.all_gather(out, in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("all_gather"), std::string::npos) << m;
    EXPECT_NE(m.find("group 'world'"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
  Tensor i = Tensor::zeros({4}, DType::i64);
  EXPECT_THROW(g.all_reduce(i, ReduceOp::avg), Error);
  Tensor f = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(g.broadcast(f, g.size()), Error);
  EXPECT_THROW(g.send(f, -1), Error);
}

// A collective one member never joins: the others time out, naming the group, the op and the
// missing ranks. The late members join afterwards, so the abandoned op completes and nothing leaks
// into later tests.
TEST(Collectives, MissingRankTimesOutWithClearMessage) {
  Communicator& c = comm();
  if (c.world_size() < 2) GTEST_SKIP() << "needs two ranks (run under mpirun)";
  std::vector<int> all;
  for (int r = 0; r < c.world_size(); ++r) all.push_back(r);
  auto g = c.new_groups({all}, "late");
  Tensor x = Tensor::from_vector(std::vector<float>{1.0f}, {1}, DType::f32);
  if (c.world_rank() == 0) {
    g->set_timeout(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    std::string m;
    try {
      g->all_reduce(x)->wait();
    } catch (const Error& e) {
      m = e.message();
    }
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    std::string missing;
    for (int r = 1; r < c.world_size(); ++r) missing += (r > 1 ? ", " : "") + std::to_string(r);
    EXPECT_NE(m.find("all_reduce(sum) on group 'late'"), std::string::npos) << m;
    EXPECT_NE(m.find("did not finish within 300 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks that did not arrive: [" + missing + "]"), std::string::npos) << m;
    EXPECT_LT(elapsed, 5s);
    c.world()->barrier();  // releases the late ranks
  } else {
    c.world()->barrier();
    g->all_reduce(x)->wait();  // completes the op rank 0 abandoned (rank 0 progresses it below)
  }
  c.world()->barrier();
}

}  // namespace
}  // namespace mg::comm
