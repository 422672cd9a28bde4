// ProcessGroup: the one communication interface every parallel module uses (DESIGN.md,
// "Communication"). A group is an ordered set of global ranks; `rank()` is this process's index in
// it. Backends: single rank (no MPI at all), MPI (OpenMPI; host tensors, and device tensors staged
// through pinned host memory), NCCL (device tensors, in megatron/platforms/cuda/). Ordering rules
// for device tensors: docs/architecture.md, "Device tensors and the ordering rules". Modules
// receive groups explicitly (a ProcessGroups bundle from parallel_state); there are no global
// getters.
//
// Semantics (all backends):
//   - Every collective is called by every member of the group, in the same order.
//   - In-place where it says so. all_gather with `in` = out's chunk rank() and reduce_scatter with
//     `out` = in's chunk rank() (the distributed optimizer's layout) are supported in place; any
//     other overlap of `out` and `in` is staged through a copy (correct, slower).
//   - Tensors are contiguous; the dtype of in and out must match; sizes are checked and a mismatch
//     is a clear error naming the op, the group and the shapes.
//   - Async: each call returns a Work handle; `wait()` blocks until the result may be read (for
//     NCCL: until the compute stream is ordered after the collective; for device tensors through
//     MPI: until the result is copied back on the waiting thread's current stream). A Work that is
//     destroyed without wait() is waited on in its destructor. `Work::wait` honours the group's
//     timeout: a collective that does not finish in time throws mg::Error naming the group, the op
//     and the ranks that did not arrive (where the backend can tell), and the launcher aborts every
//     rank.
//   - Reductions are deterministic for a fixed group size (same result on every rank, bit for bit).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace mg::comm {

enum class ReduceOp : uint8_t { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

// Work::wait timeout of a new group unless set otherwise: Megatron's --distributed-timeout-minutes
// default (10 minutes).
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

// A pending operation. wait() returns when the op's outputs are ready (or throws on timeout/error).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

// One point-to-point operation of a batched exchange (batch_isend_irecv).
struct P2POp {
  enum class Kind : uint8_t { send, recv } kind;
  Tensor tensor;  // send: source; recv: destination (pre-allocated)
  int peer;       // rank within the group
  int tag = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;  // this process's index in the group
  virtual int size() const = 0;
  // The global ranks of the members, in group order: ranks()[rank()] == this process's global rank.
  virtual const std::vector<int>& ranks() const = 0;
  // "tp", "dp-cp", ... (for messages); the backend name ("mpi", "nccl", "single").
  virtual const std::string& name() const = 0;
  virtual std::string_view backend() const = 0;

  // In place: every member's x becomes op(x over members). avg divides by size().
  virtual WorkPtr all_reduce(Tensor& x, ReduceOp op = ReduceOp::sum) = 0;
  // out [size * n] = concat over members of in [n] (in member order), along dim 0.
  virtual WorkPtr all_gather(Tensor& out, const Tensor& in) = 0;
  // out [n] = op over members of member-chunk rank() of in [size * n], chunks along dim 0.
  virtual WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
  // In place: x on every member = x on member `root` (a group rank).
  virtual WorkPtr broadcast(Tensor& x, int root) = 0;
  // out chunk j (dim 0) = chunk rank() of member j's in; equal splits.
  virtual WorkPtr all_to_all(Tensor& out, const Tensor& in) = 0;
  // Uneven all-to-all on the flat element ranges: send_counts[j] elements of in go to member j,
  // recv_counts[j] elements of out come from member j (counts in elements, laid out in member
  // order).
  virtual WorkPtr all_to_all_v(Tensor& out, const Tensor& in, std::span<const int64_t> send_counts,
                               std::span<const int64_t> recv_counts) = 0;
  virtual WorkPtr send(const Tensor& x, int peer, int tag = 0) = 0;
  virtual WorkPtr recv(Tensor& x, int peer, int tag = 0) = 0;
  virtual WorkPtr batch_isend_irecv(std::span<const P2POp> ops) = 0;
  virtual void barrier() = 0;

  // Timeout applied by Work::wait (--distributed-timeout-minutes).
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Creates the process groups of one backend; one per process (the world).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string_view backend() const = 0;
  virtual ProcessGroupPtr world() = 0;
  // Collective over the world: every process passes the same partition of (some of) the world
  // ranks into groups (e.g. all TP groups from the RankGenerator) and gets back the group holding
  // its own rank, named `name`, or nullptr when it is in none (MPI_Comm_split semantics).
  virtual ProcessGroupPtr new_groups(const std::vector<std::vector<int>>& groups,
                                     const std::string& name) = 0;

  // Timeout given to the groups created after this call (new_groups); world() is updated too.
  // Default kDefaultTimeout; ProcessGroup::set_timeout changes one group.
  void set_default_timeout(std::chrono::milliseconds timeout) {
    default_timeout_ = timeout;
    world()->set_timeout(timeout);
  }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }

 protected:
  std::chrono::milliseconds default_timeout_ = kDefaultTimeout;
};

// backend "": MPI when launched by mpirun/srun (OMPI_COMM_WORLD_SIZE / PMI_SIZE / SLURM_NTASKS set)
// and the build has MPI, else the single-rank backend; "mpi", "single" force one (an unknown or
// unavailable name is an error listing the valid ones). "nccl" comes from the CUDA platform.
std::unique_ptr<Communicator> init_communicator(std::string_view backend = "");

// The backends init_communicator can create in this process: "single", "mpi" (when built with MPI),
// and any registered by a platform ("nccl").
std::vector<std::string> available_backends();
// True when this process was started by mpirun/srun (one of OMPI_COMM_WORLD_SIZE, PMI_SIZE,
// PMIX_RANK, SLURM_NTASKS is set).
bool launched_by_mpi_launcher();
// A platform adds a backend by name (the CUDA platform: "nccl"); replaces one of the same name.
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>()>;
void register_communicator_backend(const std::string& name, CommunicatorFactory factory);

// The top-level handler of tools' main (and of the multi-rank tests): prints
// "<program>: error: [rank R of N] <message>" on stderr and ends the whole job, never a hang:
// MPI_Abort(MPI_COMM_WORLD) when MPI runs with more than one rank, else exit(1).
//   int main(...) { try { ... } catch (const std::exception& e) { mg::comm::abort_on_error(e, "x");
//   } }
[[noreturn]] void abort_on_error(const std::exception& e, std::string_view program);

}  // namespace mg::comm
