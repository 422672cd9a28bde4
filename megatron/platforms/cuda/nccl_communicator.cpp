// The NCCL backend of comm::ProcessGroup: device tensors of one GPU per process.
//
//   - Bootstrap: one process: a world of one (no MPI needed). Under mpirun/srun: the MPI backend's
//     world broadcasts rank 0's ncclUniqueId; the device is comm::select_device(comm::local_rank())
//     (core/comm/local_rank.h: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
//     MPI_LOCALRANKID, modulo the visible GPUs), the same one mg::init made current, so the
//     communicator and the rank's tensors share one GPU. new_groups = ncclCommSplit
//     of the world (collective over the world; NCCL_SPLIT_NOCOLOR for ranks in no group), after an
//     MPI check that every process passed the same partition.
//   - Streams: every group owns one non-blocking stream. An op records an event on the calling
//     thread's current compute stream and makes the group's stream wait for it (so the op reads
//     its inputs after the kernels that produced them, with no host block), runs on the group's
//     stream and records a completion event there; Work::wait() makes the current compute stream
//     wait for that event (again no host block), so kernels that read the result, or overwrite an
//     input, are ordered after it. Nothing here synchronises the device or a stream. Buffers stay
//     alive in the Work until wait(); the caching allocator then frees them on the compute stream,
//     which is ordered after the op. So DDP's bucket reduce-scatters / all-reduces launched from
//     backward hooks, and the distributed optimizer's parameter all-gathers launched before the
//     forward, run on the group's stream while the compute stream goes on (the CPU backend's
//     overlap, on the GPU).
//   - Point-to-point: send/recv and batch_isend_irecv are one NCCL group each (ncclGroupStart /
//     ncclGroupEnd), all_to_all(v) too, so paired sends and receives between two ranks never
//     deadlock on ordering. NCCL does not match tags: two ranks must issue their p2p ops in the
//     same order (as Megatron's p2p communication does).
//   - Reductions: NCCL's own (ncclAvg for avg), deterministic for a fixed group size and algorithm
//     (NCCL_ALGO pinned by the user when bit-identical results across different sizes matter).
//   - Errors and timeouts: a watchdog thread per process (PyTorch's design) follows every launched
//     op until its completion event fires: every 100 ms (MG_NCCL_WATCHDOG_INTERVAL_MS) it polls
//     ncclCommGetAsyncError of the communicators with ops in flight, and the age of each op against
//     its group's timeout (--distributed-timeout-minutes). On an asynchronous error or a timeout it
//     aborts the communicator (ncclCommAbort: kernels stuck in it return, so the host is never left
//     blocked in a copy or synchronise behind them) and records the reason; the next op on any
//     group of that communicator, and every wait() of its pending works, throws mg::Error naming
//     the group, the op and the reason, which tools' main turns into an MPI_Abort of the job
//     (comm::abort_on_error), as the MPI backend's timeouts do. barrier() blocks the host and
//     polls the same way. NCCL cannot tell which ranks did not arrive.
#include "megatron/platforms/cuda/nccl_communicator.h"

#include "megatron/core/comm/process_group.h"

#if MG_WITH_NCCL

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "megatron/core/comm/checks.h"
#include "megatron/core/comm/local_rank.h"
#include "megatron/platforms/cuda/cuda_common.h"

#define MG_NCCL_CHECK(call, ...)                                               \
  do {                                                                         \
    const ncclResult_t mg_nccl_rc_ = (call);                                   \
    if (mg_nccl_rc_ != ncclSuccess) {                                          \
      MG_THROW(#call << " failed: " << ncclGetErrorString(mg_nccl_rc_) << " (" \
                     << ncclGetLastError(nullptr) << "); " << __VA_ARGS__);    \
    }                                                                          \
  } while (0)

namespace mg::platforms::cuda {
namespace {

using comm::ProcessGroup;
using comm::ReduceOp;
using comm::WorkPtr;

// An owned NCCL communicator; destroyed (or aborted after a timeout) with its device current.
class NcclComm {
 public:
  NcclComm(ncclComm_t c, int device) : comm_(c), device_(device) {}
  ~NcclComm() {
    if (!comm_) return;
    DeviceGuard guard(device_);
    if (aborted_) return;
    ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }
  void abort() { fail("aborted"); }
  bool aborted() const { return aborted_.load(); }
  // Aborts (once) and records why; the first reason wins. Thread-safe (the watchdog calls it).
  void fail(const std::string& reason) {
    {
      std::lock_guard lock(mu_);
      if (error_.empty()) error_ = reason;
    }
    std::lock_guard lock(abort_mu_);
    if (comm_ && !aborted_) {
      DeviceGuard guard(device_);
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }
  // The recorded reason, "" while the communicator is healthy.
  std::string error() const {
    std::lock_guard lock(mu_);
    return error_;
  }
  // ncclSuccess, ncclInProgress or the asynchronous error NCCL reports for the communicator.
  ncclResult_t async_error() {
    std::lock_guard lock(abort_mu_);
    if (!comm_ || aborted_) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) return ncclSuccess;
    return r;
  }

 private:
  ncclComm_t comm_;
  int device_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // error_
  std::mutex abort_mu_;    // ncclCommAbort vs ncclCommGetAsyncError
  std::string error_;
};

class OwnedStream {
 public:
  explicit OwnedStream(int device) : device_(device) {
    DeviceGuard guard(device);
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~OwnedStream() {
    DeviceGuard guard(device_);
    detail::cuda_ok_or_ignore(cudaStreamDestroy(s_));
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  int device_;
  cudaStream_t s_ = nullptr;
};

class OwnedEvent {
 public:
  OwnedEvent() { MG_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~OwnedEvent() { detail::cuda_ok_or_ignore(cudaEventDestroy(e_)); }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// The process's watchdog (see the file comment). Started on first use, never stopped: a detached
// thread of a leaked object, so that process exit never waits for it (its CUDA calls after the
// runtime unloads fail and are ignored).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();
    return *w;
  }
  void watch(std::shared_ptr<NcclComm> comm, std::shared_ptr<OwnedEvent> done, std::string what,
             std::chrono::milliseconds timeout) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      wake = pending_.empty();  // else the thread polls on its interval anyway
      pending_.push_back({std::move(comm), std::move(done), std::move(what), timeout,
                          std::chrono::steady_clock::now()});
    }
    if (wake) cv_.notify_one();
  }

 private:
  struct Entry {
    std::shared_ptr<NcclComm> comm;
    std::shared_ptr<OwnedEvent> done;
    std::string what;
    std::chrono::milliseconds timeout;
    std::chrono::steady_clock::time_point start;
  };

  Watchdog() {
    long ms = 100;
    if (const char* v = std::getenv("MG_NCCL_WATCHDOG_INTERVAL_MS")) {
      char* end = nullptr;
      ms = std::strtol(v, &end, 10);
      MG_CHECK(end && *end == '\0' && ms >= 1 && ms <= 60000,
               "MG_NCCL_WATCHDOG_INTERVAL_MS must be an integer in [1, 60000], got '" << v << "'");
    }
    interval_ = std::chrono::milliseconds(ms);
    std::thread([this] { loop(); }).detach();
  }

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !pending_.empty(); });
      std::vector<Entry> batch = std::move(pending_);
      pending_.clear();
      lock.unlock();
      try {
        poll(batch);
      } catch (const std::exception&) {
        batch.clear();  // CUDA unusable (process exit): nothing left to watch
      }
      lock.lock();
      // Still in flight: back in front of the ops launched meanwhile.
      pending_.insert(pending_.begin(), std::make_move_iterator(batch.begin()),
                      std::make_move_iterator(batch.end()));
      if (!pending_.empty()) cv_.wait_for(lock, interval_);
    }
  }

  // Drops the entries that completed or whose communicator failed; fails the communicators with
  // an asynchronous error or an op past its timeout.
  static void poll(std::vector<Entry>& batch) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<NcclComm*> checked;
    for (Entry& e : batch) {
      if (!e.comm->error().empty()) continue;
      // The rank's own device (never the thread's default, device 0: no context there).
      DeviceGuard guard(e.comm->device());
      if (std::find(checked.begin(), checked.end(), e.comm.get()) == checked.end()) {
        checked.push_back(e.comm.get());
        const ncclResult_t r = e.comm->async_error();
        if (r != ncclSuccess && r != ncclInProgress) {
          e.comm->fail(std::string("NCCL reported an asynchronous error during ") + e.what + ": " +
                       ncclGetErrorString(r));
          continue;
        }
      }
      const cudaError_t q = cudaEventQuery(e.done->get());
      if (q == cudaSuccess) continue;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        e.comm->fail(e.what + ": CUDA error " + cudaGetErrorString(q));
        continue;
      }
      (void)cudaGetLastError();
      if (now - e.start > e.timeout) {
        std::ostringstream os;
        os << e.what << " did not finish within "
           << std::chrono::duration_cast<std::chrono::milliseconds>(e.timeout).count()
           << " ms (--distributed-timeout-minutes); NCCL cannot tell which ranks did not arrive";
        e.comm->fail(os.str());
      }
    }
    std::erase_if(batch, [](const Entry& e) {
      if (!e.comm->error().empty()) return true;
      DeviceGuard guard(e.comm->device());
      const cudaError_t q = cudaEventQuery(e.done->get());
      (void)cudaGetLastError();
      return q != cudaErrorNotReady;
    });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> pending_;
  std::chrono::milliseconds interval_{100};
};

ncclDataType_t reduce_type(DType t) {
  switch (t) {
    case DType::f64:
      return ncclFloat64;
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DType::fp8_e4m3:
      return ncclFloat8e4m3;
    case DType::fp8_e5m2:
      return ncclFloat8e5m2;
#endif
    default:
      MG_THROW("NCCL cannot reduce dtype " << dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

class NcclWork final : public comm::Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, std::string what)
      : done(std::make_shared<OwnedEvent>()),
        comm_(std::move(comm)),
        device_(comm_->device()),
        what_(std::move(what)) {}
  ~NcclWork() override {
    if (!waited_) {
      try {
        wait();
      } catch (const std::exception& e) {
        comm::abort_on_error(e, "megatron");
      }
    }
  }
  void wait() override {
    waited_ = true;
    check_comm();
    DeviceGuard guard(device_);
    MG_CUDA_CHECK(cudaStreamWaitEvent(current_stream(device_), done->get(), 0));
  }
  bool is_completed() override {
    check_comm();
    const cudaError_t e = cudaEventQuery(done->get());
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    MG_CUDA_CHECK(e);
    return true;
  }

  std::shared_ptr<OwnedEvent> done;  // shared with the watchdog
  std::vector<Tensor> keep_alive;

 private:
  void check_comm() const {
    const std::string error = comm_->error();
    MG_CHECK(error.empty(), what_ << " failed: " << error << "; the communicator was aborted");
  }

  std::shared_ptr<NcclComm> comm_;
  int device_;
  std::string what_;
  bool waited_ = false;
};

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<NcclComm> comm, std::string name, std::vector<int> ranks, int rank,
            std::chrono::milliseconds timeout)
      : comm_(std::move(comm)),
        stream_(std::make_shared<OwnedStream>(comm_->device())),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        rank_(rank),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "nccl"; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  WorkPtr all_reduce(Tensor& x, ReduceOp op) override {
    comm::detail::check_all_reduce(*this, x, op);
    check_device("all_reduce", x);
    return run("all_reduce", {x}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclAllReduce(x.raw_data(), x.raw_data(), static_cast<size_t>(x.numel()),
                                  reduce_type(x.dtype()), nccl_op(op), comm_->get(), s),
                    where("all_reduce"));
    });
  }
  WorkPtr all_gather(Tensor& out, const Tensor& in) override {
    comm::detail::check_all_gather(*this, out, in);
    check_device("all_gather", out);
    return run("all_gather", {out, in}, [&](cudaStream_t s) {
      // NCCL is in place when in is out's chunk rank(); other overlaps are a caller error here.
      MG_NCCL_CHECK(
          ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, comm_->get(), s),
          where("all_gather"));
    });
  }
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    comm::detail::check_reduce_scatter(*this, out, in, op);
    check_device("reduce_scatter", out);
    return run("reduce_scatter", {out, in}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(
          ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                            reduce_type(in.dtype()), nccl_op(op), comm_->get(), s),
          where("reduce_scatter"));
    });
  }
  WorkPtr broadcast(Tensor& x, int root) override {
    comm::detail::check_broadcast(*this, x, root);
    check_device("broadcast", x);
    return run("broadcast", {x}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(
          ncclBroadcast(x.raw_data(), x.raw_data(), x.nbytes(), ncclUint8, root, comm_->get(), s),
          where("broadcast"));
    });
  }
  WorkPtr all_to_all(Tensor& out, const Tensor& in) override {
    comm::detail::check_all_to_all(*this, out, in);
    check_device("all_to_all", out);
    const std::size_t chunk = in.nbytes() / static_cast<std::size_t>(size());
    return run("all_to_all", {out, in}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclGroupStart(), where("all_to_all"));
      for (int j = 0; j < size(); ++j) {
        const std::size_t off = chunk * static_cast<std::size_t>(j);
        MG_NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw_data()) + off, chunk, ncclUint8, j,
                               comm_->get(), s),
                      where("all_to_all"));
        MG_NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw_data()) + off, chunk, ncclUint8, j,
                               comm_->get(), s),
                      where("all_to_all"));
      }
      MG_NCCL_CHECK(ncclGroupEnd(), where("all_to_all"));
    });
  }
  WorkPtr all_to_all_v(Tensor& out, const Tensor& in, std::span<const int64_t> send_counts,
                       std::span<const int64_t> recv_counts) override {
    comm::detail::check_all_to_all_v(*this, out, in, send_counts, recv_counts);
    check_device("all_to_all_v", out);
    const std::size_t es = dtype_size(in.dtype());
    return run("all_to_all_v", {out, in}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclGroupStart(), where("all_to_all_v"));
      std::size_t so = 0, ro = 0;
      for (int j = 0; j < size(); ++j) {
        const auto sc = static_cast<std::size_t>(send_counts[static_cast<std::size_t>(j)]) * es;
        const auto rc = static_cast<std::size_t>(recv_counts[static_cast<std::size_t>(j)]) * es;
        if (sc > 0) {
          MG_NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw_data()) + so, sc, ncclUint8, j,
                                 comm_->get(), s),
                        where("all_to_all_v"));
        }
        if (rc > 0) {
          MG_NCCL_CHECK(
              ncclRecv(static_cast<char*>(out.raw_data()) + ro, rc, ncclUint8, j, comm_->get(), s),
              where("all_to_all_v"));
        }
        so += sc;
        ro += rc;
      }
      MG_NCCL_CHECK(ncclGroupEnd(), where("all_to_all_v"));
    });
  }
  WorkPtr send(const Tensor& x, int peer, int tag) override {
    comm::detail::check_p2p(*this, "send", x, peer, tag);
    check_device("send", x);
    return run("send", {x}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclSend(x.raw_data(), x.nbytes(), ncclUint8, peer, comm_->get(), s),
                    where("send"));
    });
  }
  WorkPtr recv(Tensor& x, int peer, int tag) override {
    comm::detail::check_p2p(*this, "recv", x, peer, tag);
    check_device("recv", x);
    return run("recv", {x}, [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclRecv(x.raw_data(), x.nbytes(), ncclUint8, peer, comm_->get(), s),
                    where("recv"));
    });
  }
  WorkPtr batch_isend_irecv(std::span<const comm::P2POp> ops) override {
    std::vector<Tensor> keep;
    for (const comm::P2POp& op : ops) {
      comm::detail::check_p2p(*this, "batch_isend_irecv", op.tensor, op.peer, op.tag);
      check_device("batch_isend_irecv", op.tensor);
      keep.push_back(op.tensor);
    }
    return run("batch_isend_irecv", std::move(keep), [&](cudaStream_t s) {
      MG_NCCL_CHECK(ncclGroupStart(), where("batch_isend_irecv"));
      for (const comm::P2POp& op : ops) {
        if (op.kind == comm::P2POp::Kind::send) {
          MG_NCCL_CHECK(ncclSend(op.tensor.raw_data(), op.tensor.nbytes(), ncclUint8, op.peer,
                                 comm_->get(), s),
                        where("batch_isend_irecv"));
        } else {
          MG_NCCL_CHECK(ncclRecv(op.tensor.raw_data(), op.tensor.nbytes(), ncclUint8, op.peer,
                                 comm_->get(), s),
                        where("batch_isend_irecv"));
        }
      }
      MG_NCCL_CHECK(ncclGroupEnd(), where("batch_isend_irecv"));
    });
  }

  // A one-element all-reduce the host waits for, polling until the timeout.
  void barrier() override {
    Tensor one = Tensor::zeros({1}, DType::f32, Device::cuda(comm_->device()));
    auto w = all_reduce(one, ReduceOp::sum);
    auto* work = static_cast<NcclWork*>(w.get());
    const auto start = std::chrono::steady_clock::now();
    while (!work->is_completed()) {
      const ncclResult_t async = comm_->async_error();
      if (async != ncclSuccess && async != ncclInProgress) {
        comm_->fail(std::string("NCCL reported an asynchronous error during the barrier: ") +
                    ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() - start > timeout_) {
        std::ostringstream os;
        os << "barrier on " << comm::detail::describe(*this) << " did not finish within "
           << std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count()
           << " ms (--distributed-timeout-minutes); NCCL cannot tell which ranks did not arrive";
        comm_->fail(os.str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    w->wait();
  }

 private:
  std::string where(const char* op) const {
    return std::string(op) + " on " + comm::detail::describe(*this);
  }

  void check_device(const char* op, const Tensor& t) const {
    MG_CHECK(t.device() == Device::cuda(comm_->device()),
             op << " on " << comm::detail::describe(*this) << ": the NCCL backend carries tensors "
                << "on cuda:" << comm_->device() << ", got " << t.str());
    MG_CHECK(!comm_->aborted(), op << " on " << comm::detail::describe(*this)
                                   << ": the communicator was aborted: " << comm_->error());
  }

  template <typename Launch>
  WorkPtr run(const char* op, std::vector<Tensor> keep, Launch&& launch) {
    const int device = comm_->device();
    DeviceGuard guard(device);
    auto w = std::make_unique<NcclWork>(comm_, where(op));
    OwnedEvent ready;
    MG_CUDA_CHECK(cudaEventRecord(ready.get(), current_stream(device)));
    MG_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), ready.get(), 0));
    launch(stream_->get());
    MG_CUDA_CHECK(cudaEventRecord(w->done->get(), stream_->get()));
    w->keep_alive = std::move(keep);
    Watchdog::get().watch(comm_, w->done, where(op), timeout_);
    return w;
  }

  std::shared_ptr<NcclComm> comm_;
  std::shared_ptr<OwnedStream> stream_;
  std::string name_;
  std::vector<int> ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

uint64_t partition_hash(const std::vector<std::vector<int>>& groups) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& g : groups) {
    for (int r : g) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
    h = (h ^ 0xffffffffull) * 1099511628211ull;
  }
  return h;
}

class NcclCommunicator final : public comm::Communicator {
 public:
  NcclCommunicator() {
    int count = 0;
    MG_CUDA_CHECK(cudaGetDeviceCount(&count));
    MG_CHECK(count > 0, "the NCCL backend needs a CUDA device; none is visible");
    if (comm::launched_by_mpi_launcher()) bootstrap_ = comm::init_communicator("mpi");
    rank_ = bootstrap_ ? bootstrap_->world_rank() : 0;
    size_ = bootstrap_ ? bootstrap_->world_size() : 1;
    device_ = comm::select_device(comm::local_rank().rank, count);  // as mg::init's
    ncclUniqueId id;
    if (rank_ == 0) MG_NCCL_CHECK(ncclGetUniqueId(&id), "creating the NCCL world");
    if (bootstrap_) {
      Tensor buf = Tensor::empty({static_cast<int64_t>(sizeof(id))}, DType::u8);
      std::memcpy(buf.raw_data(), &id, sizeof(id));
      bootstrap_->world()->broadcast(buf, 0)->wait();
      std::memcpy(&id, buf.raw_data(), sizeof(id));
    }
    DeviceGuard guard(device_);
    ncclComm_t c = nullptr;
    MG_NCCL_CHECK(ncclCommInitRank(&c, size_, id, rank_),
                  "creating the NCCL world of " << size_ << " ranks on cuda:" << device_);
    world_comm_ = std::make_shared<NcclComm>(c, device_);
    std::vector<int> all(static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i) all[static_cast<std::size_t>(i)] = i;
    world_ = std::make_shared<NcclGroup>(world_comm_, "world", all, rank_, default_timeout_);
  }

  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  comm::ProcessGroupPtr world() override { return world_; }

  comm::ProcessGroupPtr new_groups(const std::vector<std::vector<int>>& groups,
                                   const std::string& name) override {
    comm::detail::check_partition(groups, size_, name);
    if (bootstrap_) {
      const auto h = static_cast<int64_t>(partition_hash(groups));
      Tensor mx = Tensor::from_vector(std::vector<int64_t>{h}, {1});
      Tensor mn = mx.clone();
      bootstrap_->world()->all_reduce(mx, ReduceOp::max)->wait();
      bootstrap_->world()->all_reduce(mn, ReduceOp::min)->wait();
      MG_CHECK(mx.to_vector<int64_t>()[0] == h && mn.to_vector<int64_t>()[0] == h,
               "new_groups '" << name << "': the processes passed different partitions");
    }
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    const std::vector<int>* mine = nullptr;
    for (std::size_t i = 0; i < groups.size() && !mine; ++i) {
      for (std::size_t j = 0; j < groups[i].size(); ++j) {
        if (groups[i][j] == rank_) {
          color = static_cast<int>(i);
          key = static_cast<int>(j);
          mine = &groups[i];
        }
      }
    }
    DeviceGuard guard(device_);
    ncclComm_t c = nullptr;
    MG_NCCL_CHECK(ncclCommSplit(world_comm_->get(), color, key, &c, nullptr),
                  "new_groups '" << name << "'");
    if (!mine || !c) return nullptr;
    return std::make_shared<NcclGroup>(std::make_shared<NcclComm>(c, device_), name, *mine, key,
                                       default_timeout_);
  }

 private:
  std::unique_ptr<comm::Communicator> bootstrap_;  // MPI, for the unique id and checks
  int rank_ = 0, size_ = 1, device_ = 0;
  std::shared_ptr<NcclComm> world_comm_;
  comm::ProcessGroupPtr world_;
};

}  // namespace

void register_nccl_backend() {
  comm::register_communicator_backend("nccl", [] { return std::make_unique<NcclCommunicator>(); });
}

}  // namespace mg::platforms::cuda

#else  // !MG_WITH_NCCL

namespace mg::platforms::cuda {
void register_nccl_backend() {}
}  // namespace mg::platforms::cuda

#endif
