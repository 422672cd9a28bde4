// Internal: the built-in Communicator factories behind init_communicator (process_group.cpp).
#pragma once

#include <memory>

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

}  // namespace mg::comm::detail
