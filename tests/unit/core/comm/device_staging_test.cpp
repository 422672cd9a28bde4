// Device tensors through the communication backends, on a machine without a GPU: a fake device
// platform ("txda") whose memory is host memory holding every byte complemented (~b), so that only
// copies through the platform (Platform::copy / convert) read or write correct values. A backend
// that handed a device pointer to MPI without staging it would reduce, gather or send the
// complemented bytes and fail these checks. Every collective and point-to-point op the project
// uses runs on such tensors against a locally computed expectation (inputs are a function of
// (global rank, element), as in collectives_test). Under the MPI backend the test also checks that
// inputs went device -> host at launch and outputs host -> device on the thread that waited (the
// caller's current stream; never the progress thread). Run as an ordinary unit test it covers the
// single-rank backend; tests/CMakeLists.txt also runs it under `mpirun -np 2, 3`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "megatron/core/comm/backends.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"

namespace mg::comm {
namespace {

using namespace std::chrono_literals;

constexpr Device kDev{DeviceType::txda, 0};

struct Counters {
  std::atomic<int64_t> d2h{0}, h2d{0}, syncs{0};
  std::mutex mu;
  std::set<std::thread::id> h2d_threads;  // threads that wrote device memory from the host
};

Counters& counters() {
  static Counters c;
  return c;
}

void complement(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(~s[i]);
}

class FakeStream final : public plugin::Stream {
 public:
  Device device() const override { return kDev; }
  void synchronize() override { counters().syncs.fetch_add(1); }
  void* native_handle() override { return nullptr; }
};

class FakeDevicePlatform final : public plugin::Platform {
 public:
  std::string_view name() const override { return "txda"; }
  DeviceType device_type() const override { return DeviceType::txda; }
  plugin::Availability availability() const override {
    return {true, "fake device (complemented host memory)"};
  }
  int device_count() const override { return 1; }
  plugin::Capabilities capabilities(int) const override { return {}; }
  plugin::Allocator& allocator(int) override { return plugin::host_allocator(); }
  std::unique_ptr<plugin::Stream> create_stream(int) override {
    return std::make_unique<FakeStream>();
  }
  std::unique_ptr<plugin::Event> create_event(int, bool) override { return nullptr; }
  plugin::Stream& current_stream(int) override { return stream_; }
  void set_current_stream(int, plugin::Stream*) override {}
  void synchronize(int) override {}
  void manual_seed(uint64_t s) override { seed_ = s; }
  uint64_t seed() const override { return seed_; }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            std::size_t n) override {
    if (dst_device.is_host() == src_device.is_host()) {
      std::memmove(dst, src, n);
      return;
    }
    complement(dst, src, n);
    if (dst_device.is_host()) {
      counters().d2h.fetch_add(1);
    } else {
      counters().h2d.fetch_add(1);
      std::lock_guard lock(counters().mu);
      counters().h2d_threads.insert(std::this_thread::get_id());
    }
  }
  void memset_zero(void* dst, int, std::size_t n) override { std::memset(dst, 0xff, n); }
  void convert(void* dst, DType dt, const void* src, DType st, std::size_t n, int) override {
    std::vector<unsigned char> a(n * dtype_size(st)), b(n * dtype_size(dt));
    complement(a.data(), src, a.size());
    convert_host(b.data(), dt, a.data(), st, n);
    complement(dst, b.data(), b.size());
  }

 private:
  FakeStream stream_;
  uint64_t seed_ = 0;
};

Communicator& comm() {
  static std::unique_ptr<Communicator> c = [] {
    plugin::global_registry().register_platform(std::make_unique<FakeDevicePlatform>());
    auto p = init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}

ProcessGroup& world() {
  return *comm().world();
}

bool staged() {
  return world().backend() == "mpi";
}

double value(int rank, int64_t i) {
  return static_cast<double>((rank * 7 + i * 3) % 11) - 5.0;
}

Tensor make(DType dt, int64_t n, int rank, int64_t offset = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(rank, offset + static_cast<int64_t>(i));
  return Tensor::from_vector(v, {n}, dt, kDev);
}

// Records the copy counters around one op; `check` after wait().
struct CopyProbe {
  int64_t d2h = counters().d2h.load(), h2d = counters().h2d.load();
  void launched(bool has_input) const {
    if (staged() && has_input) {
      EXPECT_GT(counters().d2h.load(), d2h) << "no device -> host copy";
    }
  }
  void waited(bool has_output) const {
    if (!staged() || !has_output) return;
    EXPECT_GT(counters().h2d.load(), h2d) << "no host -> device copy";
    std::lock_guard lock(counters().mu);
    EXPECT_EQ(counters().h2d_threads, std::set<std::thread::id>{std::this_thread::get_id()})
        << "a host -> device copy ran on another thread than the waiting one";
  }
};

class DeviceStagingTest : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceStagingTest, AllReduce) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    Tensor x = make(dt, 37, g.rank());
    CopyProbe probe;
    auto w = g.all_reduce(x, op);
    probe.launched(true);
    w->wait();
    probe.waited(true);
    EXPECT_EQ(x.device(), kDev);
    const auto got = x.to_vector<double>();
    for (int64_t i = 0; i < 37; ++i) {
      double sum = 0, mx = -1e9;
      for (int r = 0; r < n; ++r) {
        sum += value(r, i);
        mx = std::max(mx, value(r, i));
      }
      double want = op == ReduceOp::sum ? sum : op == ReduceOp::max ? mx : 0;
      if (op == ReduceOp::avg) {
        want = dt == DType::f64 ? sum / n : static_cast<double>(static_cast<float>(sum) / n);
        want = Tensor::from_vector(std::vector<double>{want}, {1}, dt).to_vector<double>()[0];
      }
      EXPECT_EQ(got[static_cast<std::size_t>(i)], want)
          << reduce_op_name(op) << " element " << i << " rank " << g.rank();
    }
  }
}

TEST_P(DeviceStagingTest, AllGatherOutOfPlaceAndInPlace) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  const int64_t m = 9;
  for (bool in_place : {false, true}) {
    Tensor out = Tensor::zeros({n * m}, dt, kDev);
    Tensor in = in_place ? out.slice(g.rank() * m, m) : make(dt, m, g.rank());
    if (in_place) in.copy_(make(dt, m, g.rank()));
    CopyProbe probe;
    g.all_gather(out, in)->wait();
    probe.waited(true);
    const auto got = out.to_vector<double>();
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_EQ(got[static_cast<std::size_t>(r * m + i)], value(r, i))
            << (in_place ? "in place" : "out of place") << " chunk " << r << " element " << i;
      }
    }
  }
}

TEST_P(DeviceStagingTest, ReduceScatterOutOfPlaceAndInPlace) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size();
  const int64_t m = 7;
  for (bool in_place : {false, true}) {
    Tensor in = make(dt, n * m, g.rank());
    Tensor out = in_place ? in.slice(g.rank() * m, m) : Tensor::zeros({m}, dt, kDev);
    CopyProbe probe;
    g.reduce_scatter(out, in, ReduceOp::sum)->wait();
    probe.waited(true);
    const auto got = out.to_vector<double>();
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += value(r, g.rank() * m + i);
      EXPECT_EQ(got[static_cast<std::size_t>(i)], sum)
          << (in_place ? "in place" : "out of place") << " element " << i;
    }
  }
}

TEST_P(DeviceStagingTest, Broadcast) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int root = g.size() - 1;
  Tensor x = make(dt, 11, g.rank());
  g.broadcast(x, root)->wait();
  const auto got = x.to_vector<double>();
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], value(root, i));
}

TEST_P(DeviceStagingTest, AllToAllAndAllToAllV) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int64_t m = 5;
  {
    Tensor in = make(dt, n * m, me);
    Tensor out = Tensor::zeros({n * m}, dt, kDev);
    g.all_to_all(out, in)->wait();
    const auto got = out.to_vector<double>();
    for (int j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_EQ(got[static_cast<std::size_t>(j * m + i)], value(j, me * m + i))
            << "all_to_all chunk " << j << " element " << i;
      }
    }
  }
  // Member r sends (r + j + 1) elements to member j, taken from its input in member order.
  std::vector<int64_t> send(static_cast<std::size_t>(n)), recv(send.size());
  int64_t total_send = 0, total_recv = 0;
  for (int j = 0; j < n; ++j) {
    send[static_cast<std::size_t>(j)] = me + j + 1;
    recv[static_cast<std::size_t>(j)] = j + me + 1;
    total_send += me + j + 1;
    total_recv += j + me + 1;
  }
  Tensor in = make(dt, total_send, me);
  Tensor out = Tensor::zeros({total_recv}, dt, kDev);
  g.all_to_all_v(out, in, send, recv)->wait();
  const auto got = out.to_vector<double>();
  int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    int64_t offset = 0;  // where member j's chunk for me starts in its input
    for (int k = 0; k < me; ++k) offset += j + k + 1;
    for (int64_t i = 0; i < j + me + 1; ++i, ++at) {
      EXPECT_EQ(got[static_cast<std::size_t>(at)], value(j, offset + i))
          << "all_to_all_v from member " << j << " element " << i;
    }
  }
}

TEST_P(DeviceStagingTest, SendRecvAndBatchedRing) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  if (n < 2) GTEST_SKIP() << "point-to-point needs two ranks (runs under mpirun -np 2, 3)";
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const int64_t m = 13;
  {
    Tensor x = make(dt, m, me);
    Tensor y = Tensor::zeros({m}, dt, kDev);
    // Even ranks send first, odd ranks receive first (blocking pairs never deadlock).
    if (me % 2 == 0) {
      g.send(x, next, 3)->wait();
      g.recv(y, prev, 3)->wait();
    } else {
      g.recv(y, prev, 3)->wait();
      g.send(x, next, 3)->wait();
    }
    const auto got = y.to_vector<double>();
    for (int64_t i = 0; i < m; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], value(prev, i));
  }
  Tensor x = make(dt, m, me, 100);
  Tensor y = Tensor::zeros({m}, dt, kDev);
  std::vector<P2POp> ops{{P2POp::Kind::send, x, next, 0}, {P2POp::Kind::recv, y, prev, 0}};
  CopyProbe probe;
  g.batch_isend_irecv(ops)->wait();
  probe.waited(true);
  const auto got = y.to_vector<double>();
  for (int64_t i = 0; i < m; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], value(prev, 100 + i));
}

// A Work destroyed without wait() still delivers its device output (the destructor waits).
TEST_P(DeviceStagingTest, DestroyedWorkDeliversOutput) {
  const DType dt = GetParam();
  ProcessGroup& g = world();
  Tensor x = make(dt, 3, g.rank());
  { auto w = g.all_reduce(x, ReduceOp::sum); }
  const auto got = x.to_vector<double>();
  for (int64_t i = 0; i < 3; ++i) {
    double sum = 0;
    for (int r = 0; r < g.size(); ++r) sum += value(r, i);
    EXPECT_EQ(got[static_cast<std::size_t>(i)], sum);
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, DeviceStagingTest,
                         ::testing::Values(DType::f32, DType::bf16, DType::f64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mg::comm
