// A multi-rank program for the failure tests (tests/CMakeLists.txt, label mpi): under mpirun it
// makes one rank fail and ends through comm::abort_on_error, as tools' main does. The test passes
// when the whole job ends quickly, non-zero, with the failing rank's message (expect_abort.sh).
//   abort_helper throw    rank 1 throws while the others wait in an all-reduce
//   abort_helper timeout  rank 1 never joins an all-reduce; the others time out after 500 ms
#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include "megatron/core/comm/process_group.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto comm = mg::comm::init_communicator("");
    MG_CHECK(comm->world_size() >= 2, "abort_helper needs at least 2 ranks (run it under mpirun)");
    comm->set_default_timeout(mode == "timeout" ? 500ms : 60s);
    auto world = comm->world();
    mg::Tensor x = mg::Tensor::zeros({4}, mg::DType::f32);
    if (mode == "throw") {
      if (comm->world_rank() == 1) MG_THROW("rank 1 fails on purpose");
      world->all_reduce(x)->wait();  // never completes: rank 1 is gone
    } else if (mode == "timeout") {
      if (comm->world_rank() == 1) {
        std::this_thread::sleep_for(60s);  // never joins; ended by the others' MPI_Abort
      } else {
        world->all_reduce(x)->wait();
      }
    } else {
      MG_THROW("unknown mode '" << mode << "' (throw, timeout)");
    }
  } catch (const std::exception& e) {
    mg::comm::abort_on_error(e, "abort_helper");
  }
  return 0;
}
