// --exit-signal-handler (signal_handler.h).
#include "megatron/training/signal_handler.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::training {
namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

extern "C" void on_signal(int sig) {
  g_signal.store(sig, std::memory_order_relaxed);
}

}  // namespace

DistributedSignalHandler::DistributedSignalHandler() {
  MG_CHECK(!g_installed.exchange(true), "--exit-signal-handler: a handler is already installed");
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI's, file I/O) resume instead of failing
  MG_CHECK(sigaction(SIGTERM, &sa, &old_term_) == 0 && sigaction(SIGINT, &sa, &old_int_) == 0,
           "--exit-signal-handler: sigaction failed: " << std::strerror(errno));
}

DistributedSignalHandler::~DistributedSignalHandler() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  g_installed.store(false);
}

int DistributedSignalHandler::local_signal() {
  return g_signal.load(std::memory_order_relaxed);
}

int DistributedSignalHandler::received_any(comm::ProcessGroup* world) const {
  const int mine = local_signal();
  if (!world || world->size() == 1) return mine;
  Tensor t = Tensor::from_vector(std::vector<double>{static_cast<double>(mine)}, {1}, DType::f64);
  world->all_reduce(t, comm::ReduceOp::max)->wait();
  return static_cast<int>(t.to_vector<double>()[0]);
}

bool any_rank(comm::ProcessGroup* world, bool local) {
  if (!world || world->size() == 1) return local;
  Tensor t = Tensor::from_vector(std::vector<double>{local ? 1.0 : 0.0}, {1}, DType::f64);
  world->all_reduce(t, comm::ReduceOp::max)->wait();
  return t.to_vector<double>()[0] > 0.0;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

}  // namespace mg::training
