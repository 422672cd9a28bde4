// The finalisation of a checkpoint save and the caller-owned async saver (async_save.h).
#include "megatron/core/dist_checkpointing/async_save.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "megatron/core/common/error.h"

namespace mg::dist_checkpointing {
namespace {

// True on every rank when `failed` on any (collective over g).
bool any_rank(const comm::ProcessGroupPtr& g, bool failed) {
  if (!g || g->size() == 1) return failed;
  Tensor f = Tensor::from_vector(std::vector<int32_t>{failed ? 1 : 0}, {1}, DType::i32);
  g->all_reduce(f, comm::ReduceOp::max)->wait();
  return f.to_vector<int32_t>()[0] != 0;
}

}  // namespace

PendingSave::~PendingSave() {
  if (writer.joinable()) writer.join();
}

void finalize_save(PendingSave& ps) {
  std::string err;
  if (ps.error) try {
      std::rethrow_exception(ps.error);
    } catch (const std::exception& e) {
      err = e.what();
    }
  const bool failed = any_rank(ps.world, !err.empty());
  if (failed) {
    if (ps.rank0) {
      try {
        ps.target.storage->remove(ps.staged);
      } catch (const std::exception&) {  // the save's own error is the one to report
      }
    }
    MG_THROW("save_checkpoint: iteration "
             << ps.target.iteration << " was not saved (the previous "
             << "checkpoint stays the latest): " << (err.empty() ? "another rank failed" : err));
  }
  if (ps.rank0) commit_checkpoint(ps.target, ps.staged, ps.meta_text);
  if (ps.world) ps.world->barrier();
}

void maybe_inject_fault(int rank, int64_t iteration) {
  const char* env = std::getenv("MG_CHECKPOINT_FAULT_INJECT");
  if (!env) return;
  const std::string want = std::to_string(rank) + ":" + std::to_string(iteration);
  if (want != env) return;
  std::fprintf(stderr, "checkpoint fault injection: rank %d killed while saving iteration %lld\n",
               rank, static_cast<long long>(iteration));
  std::fflush(stderr);
  ::raise(SIGKILL);
}

AsyncCheckpointSaver::AsyncCheckpointSaver() = default;
AsyncCheckpointSaver::~AsyncCheckpointSaver() = default;  // ~PendingSave joins, no commit

bool AsyncCheckpointSaver::finalize() {
  if (!pending_) return false;
  std::unique_ptr<PendingSave> ps = std::move(pending_);
  if (ps->writer.joinable()) ps->writer.join();
  finalize_save(*ps);
  return true;
}

void AsyncCheckpointSaver::start(std::unique_ptr<PendingSave> save) {
  MG_CHECK(!pending_, "AsyncCheckpointSaver: iteration "
                          << pending_->target.iteration
                          << " is still pending; finalize() it before starting iteration "
                          << save->target.iteration);
  pending_ = std::move(save);
}

}  // namespace mg::dist_checkpointing
