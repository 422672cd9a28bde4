// init_communicator (backend selection), the backend registry for platforms, and abort_on_error.
#include "megatron/core/comm/process_group.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "megatron/core/comm/backends.h"

namespace mg::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

namespace {

struct BackendRegistry {
  std::mutex mu;
  std::map<std::string, CommunicatorFactory> factories;
};

BackendRegistry& backend_registry() {
  static BackendRegistry r;
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

bool launched_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

void register_communicator_backend(const std::string& name, CommunicatorFactory factory) {
  MG_CHECK(name != "single" && name != "mpi" && !name.empty(),
           "register_communicator_backend: '" << name << "' is a built-in backend name");
  MG_CHECK(factory != nullptr, "register_communicator_backend('" << name << "'): no factory");
  auto& r = backend_registry();
  std::lock_guard lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"single"};
  if (detail::mpi_built()) names.push_back("mpi");
  auto& r = backend_registry();
  std::lock_guard lock(r.mu);
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

std::unique_ptr<Communicator> init_communicator(std::string_view backend) {
  if (backend.empty()) {
    if (launched_by_mpi_launcher() && detail::mpi_built()) return detail::make_mpi_communicator();
    return detail::make_single_communicator();
  }
  if (backend == "single") return detail::make_single_communicator();
  if (backend == "mpi" && detail::mpi_built()) return detail::make_mpi_communicator();
  CommunicatorFactory factory;
  {
    auto& r = backend_registry();
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(std::string(backend));
    if (it != r.factories.end()) factory = it->second;
  }
  if (factory) return factory();
  MG_THROW(
      "unknown or unavailable communication backend '"
      << backend << "'; available in this build: " << join(available_backends())
      << (backend == "mpi" ? " (this build has no MPI: install OpenMPI and reconfigure)" : "")
      << (backend == "nccl" ? " (nccl needs the CUDA platform, initialised by mg::init())" : ""));
}

void abort_on_error(const std::exception& e, std::string_view program) {
  const auto* mg_error = dynamic_cast<const Error*>(&e);
  const std::string message = mg_error ? mg_error->message() : std::string(e.what());
  const auto [rank, size] = detail::mpi_world_rank_size();
  std::ostringstream os;
  os << (program.empty() ? "megatron" : program) << ": error: ";
  if (size > 1) os << "[rank " << rank << " of " << size << "] ";
  os << message << "\n";
  std::fputs(os.str().c_str(), stderr);
  std::fflush(stderr);
  std::fflush(stdout);
  detail::mpi_abort_if_running(1);
  std::exit(1);
}

}  // namespace mg::comm
