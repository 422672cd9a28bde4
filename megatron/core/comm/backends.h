// Internal: the built-in Communicator factories behind init_communicator (process_group.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "megatron/core/comm/process_group.h"

namespace mg::comm::detail {

std::unique_ptr<Communicator> make_single_communicator();
// Throws when the build has no MPI.
std::unique_ptr<Communicator> make_mpi_communicator();
bool mpi_built();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised with more than one rank; returns
// otherwise.
void mpi_abort_if_running(int code);
// {rank, size} of MPI_COMM_WORLD when MPI is initialised, else {0, 1}.
std::pair<int, int> mpi_world_rank_size();
// Non-blocking MPI ops completed by the progress thread so far in this process (0 without MPI or
// with the thread off): lets a test see that launched collectives advance without a wait().
int64_t mpi_background_completions();
// Whether the MPI progress thread is running (MPI_THREAD_MULTIPLE and not
// MG_MPI_PROGRESS_THREAD=0).
bool mpi_progress_thread_on();
// Whether the MPI backend hands CUDA device pointers of point-to-point ops to MPI directly: the
// library reports CUDA support (OpenMPI's MPIX_Query_cuda_support) and MG_MPI_CUDA_AWARE is not 0
// (=1 makes a library without it an error; unset or "auto": use it when present). False before MPI
// is initialised and without MPI. Device tensors of collectives are always staged through host
// memory (mpi_backend.cpp).
bool mpi_cuda_aware();

}  // namespace mg::comm::detail
