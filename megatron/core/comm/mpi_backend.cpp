// The MPI backend (OpenMPI): host tensors, non-blocking MPI collectives and point-to-point.
//
//   - MPI is initialised (MPI_THREAD_MULTIPLE requested) by the first MPI communicator and
//   finalised
//     at process exit; communicators (MPI_Comm_dup / MPI_Comm_split) are RAII-owned by groups.
//   - Reductions of f64, f32, i32, i64 and u8 use MPI's built-in ops on the tensor itself; narrow
//     floats (bf16, f16, fp8) are reduced in an f32 copy and rounded once at the end. avg = sum,
//     then divide by the group size in the reduction type. For a fixed group size and tensor size
//     OpenMPI runs the same algorithm, so results are bit-identical across ranks and runs.
//   - Progress: OpenMPI advances non-blocking collectives (libnbc schedules, rendezvous transfers)
//     only inside MPI calls, so an all-reduce launched during backward would otherwise sit still
//     until its wait(). A progress thread per process (the ProgressEngine below) polls every
//     pending op with MPI_Testall every MG_MPI_PROGRESS_INTERVAL_US microseconds (50) while there
//     is any, so launched collectives run during computation. It needs MPI_THREAD_MULTIPLE (else
//     it stays off) and is disabled with MG_MPI_PROGRESS_THREAD=0. An op is tested by one thread
//     at a time (its mutex); an error the thread finds is rethrown by the op's wait().
//   - Work::wait polls MPI_Testall until the group's
//     timeout, counted from when the op was issued, then throws naming the group, the op and the
//     members that did not arrive. Arrival is tracked cheaply through a node-local shared-memory
//     window: each process counts the collectives it entered per group; on timeout, members on this
//     node whose count is behind ours are named, members on other nodes are reported as unknown.
//   - Device tensors (a tensor whose device is not the host: `--platform cuda --distributed-backend
//     mpi`, e.g. several ranks sharing one GPU) are staged through host buffers from the device
//     platform's pinned host allocator (Tensor::empty_pinned; pageable memory, said once on stderr,
//     when the platform cannot pin more). Ordering: at launch, inputs are copied device -> host
//     with the platform's copy(), which runs on the calling thread's current (compute) stream and
//     returns when it is complete: a synchronise of the producing stream up to that point, no
//     events. MPI then works on host memory only. Outputs are copied host -> device by the thread
//     that calls wait() or is_completed() (never by the progress thread, whose current stream and
//     device are not the caller's), on its current stream, synchronously, before wait() returns:
//     kernels queued after wait() see the result. So the rule of the CPU backend holds unchanged:
//     a tensor handed to an op is not written (nor, for an output, read) until its wait().
//     Pass-through: when the MPI library is CUDA-aware (MPIX_Query_cuda_support() == 1, OpenMPI's
//     <mpi-ext.h>; MG_MPI_CUDA_AWARE=0 turns it off, =1 requires it) the point-to-point ops
//     (send, recv, batch_isend_irecv) hand CUDA device pointers to MPI directly after
//     synchronising the current stream. Collectives are always staged: OpenMPI's CUDA support
//     covers blocking collectives only, not the non-blocking ones used here (its FAQ).
//   - Does not: chunk tensors of more than 2^31 - 1 elements (an error says so).
#include "megatron/core/comm/backends.h"

#if MG_WITH_MPI

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // OpenMPI's extensions: MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "megatron/core/comm/checks.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"

#define MG_MPI_CHECK(call, ...)                                                                 \
  do {                                                                                          \
    const int mg_mpi_rc_ = (call);                                                              \
    if (mg_mpi_rc_ != MPI_SUCCESS) {                                                            \
      MG_THROW(#call << " failed: " << ::mg::comm::detail::mpi_error_string(mg_mpi_rc_) << "; " \
                     << __VA_ARGS__);                                                           \
    }                                                                                           \
  } while (0)

namespace mg::comm::detail {
namespace {

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, static_cast<std::size_t>(len));
}

bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

class MpiWork;

// The progress thread (see the file comment). Ops are registered when launched and leave when
// complete, failed, or destroyed; the thread sleeps on a condition variable while there is none.
class ProgressEngine {
 public:
  // The process's engine, started on first use; null when disabled or without
  // MPI_THREAD_MULTIPLE.
  static ProgressEngine* get();
  // Stops and joins the thread (before MPI_Finalize); ops still registered are left to their
  // wait().
  static void shutdown();

  void add(MpiWork* w) {
    {
      std::lock_guard lock(mu_);
      ops_.push_back(w);
    }
    cv_.notify_one();
  }
  void remove(MpiWork* w) {
    std::lock_guard lock(mu_);
    ops_.erase(std::remove(ops_.begin(), ops_.end(), w), ops_.end());
  }
  // Ops the thread completed (tests observe that it runs).
  static int64_t completions() { return completions_.load(std::memory_order_relaxed); }
  static void completed() { completions_.fetch_add(1, std::memory_order_relaxed); }

 private:
  explicit ProgressEngine(std::chrono::microseconds interval)
      : interval_(interval), thread_([this] { loop(); }) {}
  void loop();
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  std::mutex mu_;  // guards ops_ and stop_; held by the thread during a polling pass
  std::condition_variable cv_;
  std::vector<MpiWork*> ops_;
  bool stop_ = false;
  std::chrono::microseconds interval_;
  std::thread thread_;
  static inline std::atomic<int64_t> completions_{0};
  static inline std::mutex instance_mu_;
  static inline ProgressEngine* instance_ = nullptr;
  static inline bool disabled_ = false;
  friend class MpiEnv;
};

// MPI for the whole process: initialised once, finalised when the last holder goes (at exit: the
// static reference below is the last one).
class MpiEnv {
 public:
  MpiEnv() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    MG_CHECK(!mpi_finalized(), "MPI was already finalised in this process; cannot start it again");
    if (!initialized) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      MG_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: " << mpi_error_string(rc));
      owns_ = true;
    }
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
  }
  ~MpiEnv() {
    ProgressEngine::shutdown();
    if (owns_ && !mpi_finalized()) MPI_Finalize();
  }
  static bool thread_multiple() { return get()->thread_multiple_; }
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  static std::shared_ptr<MpiEnv> get() {
    static std::mutex mu;
    static std::shared_ptr<MpiEnv> env;
    std::lock_guard lock(mu);
    if (!env) env = std::make_shared<MpiEnv>();
    return env;
  }

 private:
  bool owns_ = false;
  bool thread_multiple_ = false;
};

ProgressEngine* ProgressEngine::get() {
  std::lock_guard lock(instance_mu_);
  if (instance_ || disabled_) return instance_;
  const char* on = std::getenv("MG_MPI_PROGRESS_THREAD");
  if ((on && std::string_view(on) == "0") || !MpiEnv::thread_multiple()) {
    disabled_ = true;
    return nullptr;
  }
  long us = 50;
  if (const char* v = std::getenv("MG_MPI_PROGRESS_INTERVAL_US")) {
    char* end = nullptr;
    us = std::strtol(v, &end, 10);
    MG_CHECK(end && *end == '\0' && us >= 0 && us <= 1000000,
             "MG_MPI_PROGRESS_INTERVAL_US must be an integer in [0, 1000000] microseconds, got '"
                 << v << "'");
  }
  instance_ = new ProgressEngine(std::chrono::microseconds(us));  // stopped by shutdown()
  return instance_;
}

void ProgressEngine::shutdown() {
  std::lock_guard lock(instance_mu_);
  disabled_ = true;
  if (!instance_) return;
  instance_->stop();
  // Not deleted: an op destroyed later may still call remove() on it (a no-op list).
}

// An owned MPI communicator (freed before MPI is finalised: it holds the environment).
class MpiComm {
 public:
  MpiComm(MPI_Comm comm, std::shared_ptr<MpiEnv> env) : comm_(comm), env_(std::move(env)) {}
  ~MpiComm() {
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
  std::shared_ptr<MpiEnv> env_;
};

// Node-local shared memory: one entry counter per (process on this node, group index). Written by
// its owner, read by anyone on the node after a timeout. Never freed before MPI_Finalize (freeing a
// window is collective, and a rank leaving early must not hang the others).
class ArrivalBoard {
 public:
  static constexpr int kMaxGroups = 512;

  // Collective over the world; on failure (no shared memory) tracking is off, nothing else changes.
  explicit ArrivalBoard(MPI_Comm world) {
    const int rc_split = MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_);
    if (rc_split != MPI_SUCCESS) return;
    MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
    int node_size = 0, world_size = 0;
    MPI_Comm_size(node_, &node_size);
    MPI_Comm_size(world, &world_size);
    int64_t* base = nullptr;
    MPI_Win win = MPI_WIN_NULL;
    const MPI_Aint bytes = static_cast<MPI_Aint>(kMaxGroups * sizeof(int64_t));
    if (MPI_Win_allocate_shared(bytes, sizeof(int64_t), MPI_INFO_NULL, node_, &base, &win) !=
        MPI_SUCCESS) {
      return;
    }
    std::memset(base, 0, static_cast<std::size_t>(bytes));
    MPI_Barrier(node_);  // every slot zeroed before anyone counts
    slots_.assign(static_cast<std::size_t>(world_size), nullptr);
    MPI_Group world_group, node_group;
    MPI_Comm_group(world, &world_group);
    MPI_Comm_group(node_, &node_group);
    std::vector<int> world_ranks(static_cast<std::size_t>(world_size)),
        node_ranks(world_ranks.size());
    for (int i = 0; i < world_size; ++i) world_ranks[static_cast<std::size_t>(i)] = i;
    MPI_Group_translate_ranks(world_group, world_size, world_ranks.data(), node_group,
                              node_ranks.data());
    for (int i = 0; i < world_size; ++i) {
      const int nr = node_ranks[static_cast<std::size_t>(i)];
      if (nr == MPI_UNDEFINED) continue;
      MPI_Aint size = 0;
      int disp = 0;
      int64_t* ptr = nullptr;
      if (MPI_Win_shared_query(win, nr, &size, &disp, &ptr) == MPI_SUCCESS) {
        slots_[static_cast<std::size_t>(i)] = ptr;
      }
    }
    MPI_Group_free(&world_group);
    MPI_Group_free(&node_group);
    int me = 0;
    MPI_Comm_rank(world, &me);
    mine_ = slots_[static_cast<std::size_t>(me)];
  }

  bool tracks(int group_index) const {
    return mine_ != nullptr && group_index >= 0 && group_index < kMaxGroups;
  }
  // Called when this process enters a collective of the group; returns the collective's number.
  int64_t enter(int group_index) {
    if (!tracks(group_index)) return 0;
    int64_t* slot = mine_ + group_index;
    const int64_t seq = __atomic_load_n(slot, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(slot, seq, __ATOMIC_RELEASE);
    return seq;
  }
  // The entry count of global rank r for the group, or -1 when r is not on this node.
  int64_t count(int global_rank, int group_index) const {
    if (!tracks(group_index)) return -1;
    const int64_t* base = slots_[static_cast<std::size_t>(global_rank)];
    return base ? __atomic_load_n(base + group_index, __ATOMIC_ACQUIRE) : -1;
  }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  std::vector<int64_t*> slots_;  // by global rank; nullptr off this node
  int64_t* mine_ = nullptr;
};

// What a Work needs to explain a timeout, shared by the group and its pending works.
struct GroupInfo {
  std::string description;  // describe(group)
  std::vector<int> ranks;   // global ranks in group order
  int index = -1;           // arrival-board slot
  std::shared_ptr<ArrivalBoard> board;
};

class MpiWork final : public Work {
 public:
  MpiWork(std::string op, std::shared_ptr<const GroupInfo> info, std::shared_ptr<MpiComm> comm,
          std::chrono::milliseconds timeout)
      : op_(std::move(op)),
        info_(std::move(info)),
        comm_(std::move(comm)),
        timeout_(timeout),
        start_(std::chrono::steady_clock::now()) {}

  ~MpiWork() override {
    if (state_ == State::pending || (state_ == State::done && !unstage.empty())) {
      try {
        wait();
      } catch (const std::exception& e) {
        // A destructor cannot throw: the job cannot continue consistently, so end it with the
        // message.
        abort_on_error(e, "megatron");
      }
    }
    if (engine_) engine_->remove(this);
    if (state_ == State::failed) {
      // MPI may still write into the buffers of an op that timed out (a late member can still
      // complete it): keep them alive for the rest of the process.
      static std::mutex mu;
      static auto* abandoned =
          new std::vector<std::pair<std::vector<Tensor>, std::function<void()>>>();
      std::lock_guard lock(mu);
      abandoned->emplace_back(std::move(keep_alive), std::move(finish));
    }
  }

  // Hands the launched op to the progress thread (if any). Called once all requests are posted.
  void submit() {
    if (requests.empty()) return;
    engine_ = ProgressEngine::get();
    if (engine_) engine_->add(this);
  }

  // One progress-thread test; true when the op left the pending state (the thread drops it). Never
  // blocks on a caller inside wait() (it tests then).
  bool poll() {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (state_ != State::pending) return true;
    try {
      if (!test()) return false;
      ProgressEngine::completed();
    } catch (...) {
      error_ = std::current_exception();  // rethrown by wait()
      state_ = State::failed;
    }
    return true;
  }

  std::vector<MPI_Request> requests;
  std::vector<Tensor> keep_alive;  // buffers MPI reads or writes until completion
  std::function<void()> finish;    // runs once, after completion (unstage, divide, check counts)
  int64_t seq = 0;                 // collective number on the arrival board (0: p2p / untracked)
  std::vector<int> peers;          // p2p: the group ranks this op waits for
  struct RecvCheck {
    std::size_t request;  // index in requests
    int count;            // elements expected
    MPI_Datatype type;
    int peer;
    std::string what;  // the destination tensor
  };
  std::vector<RecvCheck> recv_checks;  // a shorter message than the tensor is an error
  // Device outputs and their host images: copied host -> device by the waiting thread once the
  // op is done (see the file comment).
  struct Unstage {
    Tensor device;
    Tensor host;
  };
  std::vector<Unstage> unstage;

  void wait() override {
    std::unique_lock lock(mu_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (state_ == State::done) return unstage_outputs();
    MG_CHECK(state_ != State::failed,
             op_ << " on " << info_->description << ": wait() after the op already failed");
    int spins = 0;
    auto sleep = std::chrono::microseconds(1);
    while (!test()) {
      if (std::chrono::steady_clock::now() - start_ > timeout_) {
        state_ = State::failed;
        MG_THROW(timeout_message());
      }
      lock.unlock();  // let the progress thread test meanwhile
      if (++spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(200));
      }
      lock.lock();
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      if (state_ == State::done) return unstage_outputs();
    }
    unstage_outputs();
  }
  bool is_completed() override {
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (state_ == State::failed) return false;
    if (state_ != State::done && !test()) return false;
    unstage_outputs();
    return true;
  }

 private:
  enum class State { pending, done, failed };

  // The caller's thread, once done: device outputs get their host images (synchronous copies on
  // the caller's current stream).
  void unstage_outputs() {
    auto todo = std::exchange(unstage, {});
    for (Unstage& u : todo) u.device.copy_(u.host);
  }

  bool test() {
    if (!requests.empty()) {
      int flag = 0;
      statuses_.resize(requests.size());
      const int rc =
          MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses_.data());
      if (rc != MPI_SUCCESS) {
        state_ = State::failed;
        int code = rc;
        if (rc == MPI_ERR_IN_STATUS) {
          for (const MPI_Status& s : statuses_) {
            if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) code = s.MPI_ERROR;
          }
        }
        MG_THROW(op_ << " on " << info_->description << " failed: " << mpi_error_string(code));
      }
      if (!flag) return false;
    }
    state_ = State::done;
    for (const RecvCheck& r : recv_checks) {
      int got = 0;
      MPI_Get_count(&statuses_[r.request], r.type, &got);
      MG_CHECK(got == r.count, op_ << " on " << info_->description << ": received " << got
                                   << " elements from group rank " << r.peer << " into " << r.what
                                   << " (" << r.count << " elements); sizes must match");
    }
    if (finish) {
      auto f = std::move(finish);
      f();
    }
    keep_alive.clear();
    return true;
  }

  std::string timeout_message() const {
    std::ostringstream os;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
    os << op_ << " on " << info_->description << " did not finish within " << ms
       << " ms (--distributed-timeout-minutes)";
    const auto& ranks = info_->ranks;
    if (!peers.empty()) {
      std::vector<int> g;
      for (int p : peers) g.push_back(ranks[static_cast<std::size_t>(p)]);
      os << "; waiting for global rank(s) " << ranks_str(g);
    } else if (seq > 0) {
      std::vector<int> missing, unknown;
      std::ostringstream counts;
      for (int r : ranks) {
        const int64_t c = info_->board->count(r, info_->index);
        if (c < 0) {
          unknown.push_back(r);
        } else {
          counts << (counts.tellp() > 0 ? ", " : "") << "rank " << r << ": " << c;
          if (c < seq) missing.push_back(r);
        }
      }
      if (!missing.empty() || unknown.empty()) {
        if (!missing.empty()) {
          os << "; ranks that did not arrive: " << ranks_str(missing);
        } else {
          // Everyone on this node entered it: the members disagree on what this collective is
          // (another op or size at the same position) or one of them stalls inside it.
          os << "; every member entered this group's collective #" << seq
             << ", so it is mismatched (another op or size on some rank) or stalled inside MPI";
        }
        os << " (collectives entered per rank: " << counts.str() << ")";
      } else {
        os << "; no member on this node is missing";
      }
      if (!unknown.empty())
        os << "; ranks on other nodes (arrival unknown): " << ranks_str(unknown);
    } else {
      os << "; which ranks did not arrive is unknown";
    }
    return os.str();
  }

  std::string op_;
  std::shared_ptr<const GroupInfo> info_;
  std::shared_ptr<MpiComm> comm_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_;
  std::vector<MPI_Status> statuses_;
  State state_ = State::pending;
  std::mutex mu_;                     // one tester at a time: the caller or the progress thread
  std::exception_ptr error_;          // found by the progress thread
  ProgressEngine* engine_ = nullptr;  // registered with, when submitted
};

void ProgressEngine::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (ops_.empty()) {
      cv_.wait(lock, [this] { return stop_ || !ops_.empty(); });
      continue;
    }
    std::erase_if(ops_, [](MpiWork* w) { return w->poll(); });
    lock.unlock();
    if (interval_.count() > 0) {
      std::this_thread::sleep_for(interval_);
    } else {
      std::this_thread::yield();
    }
    lock.lock();
  }
}

// Element type for moving bytes (no arithmetic): an unsigned integer of the element's size.
MPI_Datatype copy_type(DType t) {
  switch (dtype_size(t)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
  }
  MG_THROW("no MPI copy type for dtype " << dtype_name(t));
}

// Element type for reductions; MPI_DATATYPE_NULL for the narrow floats (reduced in f32).
MPI_Datatype reduce_type(DType t) {
  switch (t) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// x /= n in x's dtype (f64 or f32: the reduction types of floats).
void divide(Tensor& x, int n) {
  if (x.dtype() == DType::f64) {
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] /= n;
  } else {
    float* p = x.data<float>();
    const auto fn = static_cast<float>(n);
    for (int64_t i = 0; i < x.numel(); ++i) p[i] /= fn;
  }
}

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(std::shared_ptr<MpiComm> comm, std::string name, std::vector<int> ranks, int index,
           std::shared_ptr<ArrivalBoard> board, std::chrono::milliseconds timeout)
      : comm_(std::move(comm)),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        timeout_(timeout) {
    MPI_Comm_rank(comm_->get(), &rank_);
    MPI_Comm_size(comm_->get(), &size_);
    auto info = std::make_shared<GroupInfo>();
    info->description = describe(*this);
    info->ranks = ranks_;
    info->index = index;
    info->board = std::move(board);
    info_ = std::move(info);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "mpi"; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  WorkPtr all_reduce(Tensor& x, ReduceOp op) override {
    check_all_reduce(*this, x, op);
    auto w = collective("all_reduce(" + std::string(reduce_op_name(op)) + ")");
    if (x.numel() == 0) return w;
    const int n = count("all_reduce", x.numel());
    Tensor hx = host_image(*w, "all_reduce", x, true, true);
    const MPI_Datatype native = reduce_type(x.dtype());
    Tensor buf = native != MPI_DATATYPE_NULL ? hx : hx.to(DType::f32);
    const MPI_Datatype type = native != MPI_DATATYPE_NULL ? native : MPI_FLOAT;
    w->requests.emplace_back();
    MG_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), n, type, mpi_op(op), comm(),
                                &w->requests.back()),
                 "all_reduce on " << info_->description << " of " << x.str());
    w->keep_alive = {buf, hx};
    if (op == ReduceOp::avg || !buf.shares_storage_with(hx)) {
      const int size = size_;
      w->finish = [buf, hx, op, size]() mutable {
        if (op == ReduceOp::avg) divide(buf, size);
        if (!buf.shares_storage_with(hx)) hx.copy_(buf);
      };
    }
    w->submit();
    return w;
  }

  WorkPtr all_gather(Tensor& out, const Tensor& in) override {
    check_all_gather(*this, out, in);
    auto w = collective("all_gather");
    if (in.numel() == 0) return w;
    const int n = count("all_gather", in.numel());
    const MPI_Datatype type = copy_type(in.dtype());
    const bool in_place =
        out.shares_storage_with(in) &&
        in.offset_bytes() == out.offset_bytes() + static_cast<std::size_t>(rank_) * in.nbytes();
    Tensor hout = host_image(*w, "all_gather", out, false, true);
    Tensor src = in_place ? in : host_image(*w, "all_gather", in, true, false);
    const void* send = src.raw_data();
    if (in_place) {
      send = MPI_IN_PLACE;  // in is exactly this member's chunk of out
      if (!out.is_host()) hout.view({-1}).slice(rank_ * in.numel(), in.numel()).copy_(in);
    } else if (overlaps(hout, src)) {
      src = src.clone();
      send = src.raw_data();
    }
    w->requests.emplace_back();
    MG_MPI_CHECK(
        MPI_Iallgather(send, n, type, hout.raw_data(), n, type, comm(), &w->requests.back()),
        "all_gather on " << info_->description << " of " << in.str());
    w->keep_alive = {src, hout};
    w->submit();
    return w;
  }

  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    check_reduce_scatter(*this, out, in, op);
    auto w = collective("reduce_scatter(" + std::string(reduce_op_name(op)) + ")");
    if (out.numel() == 0) return w;
    const int n = count("reduce_scatter", out.numel());
    const Tensor hin = host_image(*w, "reduce_scatter", in, true, false);
    Tensor hout = host_image(*w, "reduce_scatter", out, false, true);
    const MPI_Datatype native = reduce_type(in.dtype());
    const bool staged = native == MPI_DATATYPE_NULL || overlaps(hout, hin);
    Tensor src = native != MPI_DATATYPE_NULL ? hin : hin.to(DType::f32);
    Tensor dst = staged ? Tensor::empty({out.numel()}, src.dtype()) : hout;
    const MPI_Datatype type = native != MPI_DATATYPE_NULL ? native : MPI_FLOAT;
    w->requests.emplace_back();
    MG_MPI_CHECK(MPI_Ireduce_scatter_block(src.raw_data(), dst.raw_data(), n, type, mpi_op(op),
                                           comm(), &w->requests.back()),
                 "reduce_scatter on " << info_->description << " of " << in.str());
    w->keep_alive = {src, dst, hout};
    if (op == ReduceOp::avg || staged) {
      const int size = size_;
      w->finish = [dst, hout, op, size, staged]() mutable {
        if (op == ReduceOp::avg) divide(dst, size);
        if (staged) hout.copy_(dst);
      };
    }
    w->submit();
    return w;
  }

  WorkPtr broadcast(Tensor& x, int root) override {
    check_broadcast(*this, x, root);
    auto w = collective("broadcast(root " + std::to_string(root) + ")");
    if (x.numel() == 0) return w;
    const int n = count("broadcast", x.numel());
    const Tensor hx = host_image(*w, "broadcast", x, rank_ == root, rank_ != root);
    w->requests.emplace_back();
    MG_MPI_CHECK(
        MPI_Ibcast(hx.raw_data(), n, copy_type(x.dtype()), root, comm(), &w->requests.back()),
        "broadcast on " << info_->description << " of " << x.str());
    w->keep_alive = {hx};
    w->submit();
    return w;
  }

  WorkPtr all_to_all(Tensor& out, const Tensor& in) override {
    check_all_to_all(*this, out, in);
    auto w = collective("all_to_all");
    if (in.numel() == 0) return w;
    const int n = count("all_to_all", in.numel() / size_);
    const Tensor hin = host_image(*w, "all_to_all", in, true, false);
    const Tensor hout = host_image(*w, "all_to_all", out, false, true);
    const Tensor src = overlaps(hout, hin) ? hin.clone() : hin;
    const MPI_Datatype type = copy_type(in.dtype());
    w->requests.emplace_back();
    MG_MPI_CHECK(MPI_Ialltoall(src.raw_data(), n, type, hout.raw_data(), n, type, comm(),
                               &w->requests.back()),
                 "all_to_all on " << info_->description << " of " << in.str());
    w->keep_alive = {src, hout};
    w->submit();
    return w;
  }

  WorkPtr all_to_all_v(Tensor& out, const Tensor& in, std::span<const int64_t> send_counts,
                       std::span<const int64_t> recv_counts) override {
    check_all_to_all_v(*this, out, in, send_counts, recv_counts);
    auto w = collective("all_to_all_v");
    auto to_int = [this](std::span<const int64_t> c, std::vector<int>& counts,
                         std::vector<int>& displs) {
      int64_t d = 0;
      for (int64_t v : c) {
        counts.push_back(count("all_to_all_v", v));
        displs.push_back(count("all_to_all_v", d));
        d += v;
      }
    };
    auto counts = std::make_shared<std::vector<int>[]>(4);  // MPI may read them until completion
    to_int(send_counts, counts[0], counts[1]);
    to_int(recv_counts, counts[2], counts[3]);
    const Tensor hin = host_image(*w, "all_to_all_v", in, true, false);
    const Tensor hout = host_image(*w, "all_to_all_v", out, false, true);
    const Tensor src = overlaps(hout, hin) ? hin.clone() : hin;
    const MPI_Datatype type = copy_type(in.dtype());
    w->requests.emplace_back();
    MG_MPI_CHECK(
        MPI_Ialltoallv(src.raw_data(), counts[0].data(), counts[1].data(), type, hout.raw_data(),
                       counts[2].data(), counts[3].data(), type, comm(), &w->requests.back()),
        "all_to_all_v on " << info_->description << " of " << in.str());
    w->keep_alive = {src, hout};
    w->finish = [counts]() {};  // keeps the count arrays alive until completion
    w->submit();
    return w;
  }

  WorkPtr send(const Tensor& x, int peer, int tag) override {
    check_p2p(*this, "send", x, peer, tag);
    auto w = p2p("send to group rank " + std::to_string(peer), peer);
    post_send(*w, x, peer, tag);
    w->submit();
    return w;
  }

  WorkPtr recv(Tensor& x, int peer, int tag) override {
    check_p2p(*this, "recv", x, peer, tag);
    auto w = p2p("recv from group rank " + std::to_string(peer), peer);
    post_recv(*w, x, peer, tag);
    w->submit();
    return w;
  }

  WorkPtr batch_isend_irecv(std::span<const P2POp> ops) override {
    std::ostringstream name;
    name << "batch_isend_irecv(" << ops.size() << " ops)";
    auto w = p2p(name.str(), -1);
    for (const P2POp& op : ops) {
      const bool is_send = op.kind == P2POp::Kind::send;
      check_p2p(*this, is_send ? "batch_isend_irecv send" : "batch_isend_irecv recv", op.tensor,
                op.peer, op.tag);
      w->peers.push_back(op.peer);
    }
    // Receives first, so that every send finds its receive already posted.
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::recv) post_recv(*w, op.tensor, op.peer, op.tag);
    }
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::send) post_send(*w, op.tensor, op.peer, op.tag);
    }
    std::sort(w->peers.begin(), w->peers.end());
    w->peers.erase(std::unique(w->peers.begin(), w->peers.end()), w->peers.end());
    w->submit();
    return w;
  }

  void barrier() override {
    auto w = collective("barrier");
    w->requests.emplace_back();
    MG_MPI_CHECK(MPI_Ibarrier(comm(), &w->requests.back()), "barrier on " << info_->description);
    w->wait();
  }

 private:
  MPI_Comm comm() const { return comm_->get(); }

  // The buffer MPI works on for tensor t of one op (see the file comment): t itself on the host;
  // else a staging buffer in pinned host memory, filled from t now when `read` (an input), and
  // copied back into t by the waiting thread when `write` (an output).
  Tensor host_image(MpiWork& w, const char* op, const Tensor& t, bool read, bool write) const {
    if (t.is_host()) return t;
    Tensor h;
    try {
      h = Tensor::empty_pinned(t.shape(), t.dtype(), t.device());
    } catch (const std::exception& e) {
      MG_THROW(op << " on " << info_->description << ": no host memory for the staging buffer of "
                  << t.str() << " (" << t.nbytes() << " bytes) that carries a device tensor "
                  << "through MPI: " << e.what());
    }
    if (!h.is_pinned()) warn_pageable_staging(op, t);
    if (read) h.copy_(t);
    if (write) w.unstage.push_back({t, h});
    return h;
  }

  // Point-to-point buffers: a CUDA tensor itself when MPI is CUDA-aware (after the current stream
  // has finished the kernels that produce or last read it), else its host image.
  Tensor p2p_image(MpiWork& w, const char* op, const Tensor& t, bool read, bool write) const {
    if (!t.is_host() && t.device().type == DeviceType::cuda && mpi_cuda_aware()) {
      plugin::global_registry()
          .platform(t.device().type)
          .current_stream(t.device().index)
          .synchronize();
      return t;
    }
    return host_image(w, op, t, read, write);
  }

  void warn_pageable_staging(const char* op, const Tensor& t) const {
    static std::once_flag once;
    std::call_once(once, [&] {
      const auto stats =
          plugin::global_registry().platform(t.device().type).pinned_host_allocator().stats();
      std::fprintf(stderr,
                   "megatron: warning: the MPI backend could not pin %zu more bytes for %s on %s "
                   "(%zu bytes of pinned memory held); staging device tensors through pageable "
                   "memory (slower copies) while pinned memory is short\n",
                   t.nbytes(), op, info_->description.c_str(), stats.reserved_bytes);
    });
  }

  int count(const char* op, int64_t n) const {
    MG_CHECK(n <= INT_MAX, op << " on " << info_->description << ": " << n
                              << " elements exceed MPI's int count (2^31 - 1); split the tensor");
    return static_cast<int>(n);
  }

  std::unique_ptr<MpiWork> collective(std::string op) {
    auto w = std::make_unique<MpiWork>(std::move(op), info_, comm_, timeout_);
    if (info_->board) w->seq = info_->board->enter(info_->index);
    return w;
  }

  std::unique_ptr<MpiWork> p2p(std::string op, int peer) {
    auto w = std::make_unique<MpiWork>(std::move(op), info_, comm_, timeout_);
    if (peer >= 0) w->peers.push_back(peer);
    return w;
  }

  void post_send(MpiWork& w, const Tensor& x, int peer, int tag) {
    const int n = count("send", x.numel());
    const Tensor hx = p2p_image(w, "send", x, true, false);
    w.requests.emplace_back();
    MG_MPI_CHECK(
        MPI_Isend(hx.raw_data(), n, copy_type(x.dtype()), peer, tag, comm(), &w.requests.back()),
        "send of " << x.str() << " to group rank " << peer << " on " << info_->description);
    w.keep_alive.push_back(hx);
  }

  void post_recv(MpiWork& w, const Tensor& x, int peer, int tag) {
    const int n = count("recv", x.numel());
    const Tensor hx = p2p_image(w, "recv", x, false, true);
    w.recv_checks.push_back({w.requests.size(), n, copy_type(x.dtype()), peer, x.str()});
    w.requests.emplace_back();
    MG_MPI_CHECK(
        MPI_Irecv(hx.raw_data(), n, copy_type(x.dtype()), peer, tag, comm(), &w.requests.back()),
        "recv of " << x.str() << " from group rank " << peer << " on " << info_->description);
    w.keep_alive.push_back(hx);
  }

  std::shared_ptr<MpiComm> comm_;
  std::string name_;
  std::vector<int> ranks_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 0;
  std::shared_ptr<const GroupInfo> info_;
};

// FNV-1a over the partition, to check that every process passed the same one.
uint64_t partition_hash(const std::vector<std::vector<int>>& groups) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (const auto& g : groups) {
    mix(0xffffffffull);
    for (int r : g) mix(static_cast<uint64_t>(r));
  }
  return h;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() : env_(MpiEnv::get()) {
    MPI_Comm dup = MPI_COMM_NULL;
    MG_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "creating the world communicator");
    world_comm_ = std::make_shared<MpiComm>(dup, env_);
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    MPI_Comm_rank(dup, &rank_);
    MPI_Comm_size(dup, &size_);
    board_ = std::make_shared<ArrivalBoard>(dup);
    std::vector<int> all(static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i) all[static_cast<std::size_t>(i)] = i;
    world_ = std::make_shared<MpiGroup>(world_comm_, "world", all, next_index_++, board_,
                                        default_timeout_);
  }

  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  ProcessGroupPtr world() override { return world_; }

  ProcessGroupPtr new_groups(const std::vector<std::vector<int>>& groups,
                             const std::string& name) override {
    check_partition(groups, size_, name);
    const int index = next_index_++;
    // Every process must pass the same partition: compare a hash (max == min over the world).
    uint64_t h[2] = {partition_hash(groups), ~partition_hash(groups)};
    uint64_t r[2] = {0, 0};
    MG_MPI_CHECK(MPI_Allreduce(h, r, 2, MPI_UINT64_T, MPI_MAX, world_comm_->get()),
                 "new_groups '" << name << "'");
    MG_CHECK(r[0] == h[0] && r[1] == h[1],
             "new_groups '" << name << "': the processes passed different partitions of the world "
                            << "(this rank " << rank_ << " passed " << groups.size()
                            << " groups); every rank must pass the same list");
    int color = MPI_UNDEFINED, key = 0;
    const std::vector<int>* mine = nullptr;
    for (std::size_t i = 0; i < groups.size() && !mine; ++i) {
      for (std::size_t j = 0; j < groups[i].size(); ++j) {
        if (groups[i][j] == rank_) {
          color = static_cast<int>(i);
          key = static_cast<int>(j);
          mine = &groups[i];
          break;
        }
      }
    }
    MPI_Comm split = MPI_COMM_NULL;
    MG_MPI_CHECK(MPI_Comm_split(world_comm_->get(), color, key, &split),
                 "new_groups '" << name << "'");
    if (split == MPI_COMM_NULL) return nullptr;
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    auto comm = std::make_shared<MpiComm>(split, env_);
    return std::make_shared<MpiGroup>(comm, name, *mine, index, board_, default_timeout_);
  }

 private:
  std::shared_ptr<MpiEnv> env_;
  std::shared_ptr<MpiComm> world_comm_;
  std::shared_ptr<ArrivalBoard> board_;
  int rank_ = 0, size_ = 1;
  int next_index_ = 0;
  ProcessGroupPtr world_;
};

}  // namespace

bool mpi_built() {
  return true;
}

int64_t mpi_background_completions() {
  return ProgressEngine::completions();
}

bool mpi_progress_thread_on() {
  return ProgressEngine::get() != nullptr;
}

bool mpi_cuda_aware() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || mpi_finalized()) return false;
  static const bool aware = [] {
    bool library = false;
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
    library = MPIX_Query_cuda_support() == 1;
#endif
    const char* env = std::getenv("MG_MPI_CUDA_AWARE");
    const std::string_view mode = env ? env : "auto";
    MG_CHECK(mode == "auto" || mode == "0" || mode == "1",
             "MG_MPI_CUDA_AWARE must be 0, 1 or auto, got '" << mode << "'");
    MG_CHECK(mode != "1" || library,
             "MG_MPI_CUDA_AWARE=1 but this MPI library does not report CUDA support "
             "(MPIX_Query_cuda_support() is not 1); unset it to stage device tensors through "
             "pinned host memory");
    return mode != "0" && library;
  }();
  return aware;
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

void mpi_abort_if_running(int code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || mpi_finalized()) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

std::pair<int, int> mpi_world_rank_size() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || mpi_finalized()) return {0, 1};
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return {rank, size};
}

}  // namespace mg::comm::detail

#else  // !MG_WITH_MPI

namespace mg::comm::detail {

bool mpi_built() {
  return false;
}
int64_t mpi_background_completions() {
  return 0;
}
bool mpi_progress_thread_on() {
  return false;
}
bool mpi_cuda_aware() {
  return false;
}
std::unique_ptr<Communicator> make_mpi_communicator() {
  MG_THROW("this build has no MPI (OpenMPI was not found at configure time)");
}
void mpi_abort_if_running(int) {}
std::pair<int, int> mpi_world_rank_size() {
  return {0, 1};
}

}  // namespace mg::comm::detail

#endif
