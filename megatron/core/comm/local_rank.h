// The node-local rank of this process and the device it selects: one function for the runtime
// (mg::init, which makes that device current) and the NCCL communicator (which must use the same
// device), so that every rank of a multi-GPU node works on its own GPU.
//
// Precedence (the first variable that is set wins; later ones are not consulted):
//   1. LOCAL_RANK                  torchrun / torch.distributed launchers, and the explicit
//   override
//   2. OMPI_COMM_WORLD_LOCAL_RANK  OpenMPI's mpirun
//   3. SLURM_LOCALID               srun
//   4. MPI_LOCALRANKID             MPICH / Intel MPI (hydra)
//   none set: local rank 0 (one process per node).
// OpenMPI comes before SLURM because mpirun inside an allocation inherits the batch step's
// SLURM_LOCALID (0 on every rank) while OMPI_COMM_WORLD_LOCAL_RANK is the real one.
// A set variable must be a non-negative decimal integer (surrounding blanks allowed); anything else
// is an error naming the variable and its value, never a silent device 0.
// Not here: device counting (the platform's), CUDA_VISIBLE_DEVICES handling (the driver's: the
// index is into the visible devices).
#pragma once

#include <functional>
#include <string>

namespace mg::comm {

struct LocalRank {
  int rank = 0;
  std::string source;  // the variable it came from, or "default" when none was set
};

// The variables consulted, in precedence order.
inline constexpr const char* kLocalRankVars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                                 "SLURM_LOCALID", "MPI_LOCALRANKID"};

// Reads the variables through `getenv` (tests pass a fake environment).
using GetEnv = std::function<const char*(const char*)>;
LocalRank local_rank_from(const GetEnv& getenv);
// From the process environment.
LocalRank local_rank();

// The device of a local rank: local_rank % device_count (more ranks than devices share them
// round-robin, as with oversubscribed CPU runs). device_count must be positive.
int select_device(int local_rank, int device_count);

}  // namespace mg::comm
