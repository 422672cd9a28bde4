// Async checkpoint save (--async-save; sharded format): the pieces are copied to host memory, a
// background thread writes this rank's file, and the finalisation (an all-rank check that every
// file was written, metadata.json, the storage's commit, the tracker) runs later on the calling
// thread, so collectives never leave it.
// The pending save belongs to an AsyncCheckpointSaver the caller owns (the training run holds
// one and passes it to every save_checkpoint); there is no process-wide state. A saver destroyed
// with a save pending joins the writer and does not commit it: the staged directory stays, never
// loaded, and the previous checkpoint stays the latest.
// Also here: the synchronous finalisation shared with the non-async save (finalize_save) and the
// test hook MG_CHECKPOINT_FAULT_INJECT.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "megatron/core/dist_checkpointing/format_common.h"

namespace mg::dist_checkpointing {

// One save between its file write and its commit.
struct PendingSave {
  std::thread writer;        // joinable while the file is being written in the background
  std::exception_ptr error;  // the write's failure, if any
  comm::ProcessGroupPtr world;
  bool rank0 = true;  // world rank 0 commits
  SaveTarget target;
  std::string staged;
  std::string meta_text;  // metadata.json (world rank 0)
  ~PendingSave();
};

// Every rank: throws on every rank when any rank failed to write its file (the staged directory is
// removed, the previous checkpoint stays the latest); otherwise world rank 0 commits
// (commit_checkpoint) and all ranks barrier. Collective over ps.world.
void finalize_save(PendingSave& ps);

// Test hook: MG_CHECKPOINT_FAULT_INJECT=<rank>:<iteration> kills that world rank (SIGKILL) after it
// wrote its file of that iteration and before metadata.json and the commit: a rank dying in the
// middle of a save (tests/unit/training/checkpoint_reshard.sh crash).
void maybe_inject_fault(int rank, int64_t iteration);

class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver();
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  bool pending() const { return pending_ != nullptr; }
  // Waits for the pending save's file write and finalises it (collective over the ranks of that
  // save: every rank calls it). Returns false when nothing was pending.
  bool finalize();
  // Takes a save whose writer thread is running (save_sharded); one at a time: a pending save
  // must be finalised first.
  void start(std::unique_ptr<PendingSave> save);

 private:
  std::unique_ptr<PendingSave> pending_;
};

}  // namespace mg::dist_checkpointing
