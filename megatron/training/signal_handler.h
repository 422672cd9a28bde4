// --exit-signal-handler: Megatron's DistributedSignalHandler. While it lives, SIGTERM and SIGINT
// only set a flag (the previous handlers come back on destruction); the training loop asks
// received_any() after every iteration, which all-reduces the flag over the world (max), so that
// every rank takes the same decision at the same iteration even when the signal reached only some
// of them, or reached them at different iterations. The loop then saves a checkpoint (with --save)
// and leaves training; pretrain_gpt exits 0 on every rank.
#pragma once

#include <csignal>

#include "megatron/core/comm/process_group.h"

namespace mg::training {

class DistributedSignalHandler {
 public:
  DistributedSignalHandler();   // installs the handlers (one instance at a time)
  ~DistributedSignalHandler();  // restores the previous ones
  DistributedSignalHandler(const DistributedSignalHandler&) = delete;
  DistributedSignalHandler& operator=(const DistributedSignalHandler&) = delete;

  // The signal this rank received (SIGTERM / SIGINT), 0 if none.
  static int local_signal();
  // Collective over `world` (null: this rank alone): the largest signal number any rank received,
  // 0 if none did.
  int received_any(comm::ProcessGroup* world) const;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

// Collective over `world` (null: this rank alone): whether `local` holds on any rank (all-reduce
// max), so that every rank takes an exit decision made from its own clock at the same iteration.
bool any_rank(comm::ProcessGroup* world, bool local);

// "SIGTERM", "SIGINT", else "a signal".
const char* signal_name(int sig);

}  // namespace mg::training
