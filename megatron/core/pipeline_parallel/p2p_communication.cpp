// Pipeline p2p (p2p_communication.h).
#include "megatron/core/pipeline_parallel/p2p_communication.h"

#include <exception>

#include "megatron/core/common/error.h"

namespace mg::pipeline_parallel {

P2PCommunicator::P2PCommunicator(comm::ProcessGroup& pp_group, Shape shape, DType dtype,
                                 Device device)
    : group_(pp_group), shape_(std::move(shape)), dtype_(dtype), device_(device) {}

P2PCommunicator::~P2PCommunicator() {
  if (std::uncaught_exceptions() > 0) return;  // unwinding: do not wait on a broken pipeline
  try {
    wait_sends();
  } catch (...) {
  }
}

P2PCommunicator::Recv P2PCommunicator::post_recv(int peer, int tag) {
  Recv r;
  r.tensor = Tensor::empty(shape_, dtype_, device_);
  r.work = group_.recv(r.tensor, peer, tag);
  return r;
}

Tensor P2PCommunicator::wait(Recv& r) {
  MG_CHECK(r.work != nullptr, "P2PCommunicator::wait: no receive was posted");
  r.work->wait();
  r.work.reset();
  return r.tensor;
}

void P2PCommunicator::send(const Tensor& x, int peer, int tag) {
  MG_CHECK(x.shape() == shape_ && x.dtype() == dtype_,
           "pipeline send to rank " << peer << ": the tensor is " << x.str() << ", expected "
                                    << shape_str(shape_) << " " << dtype_name(dtype_));
  reap();
  Tensor keep = x;
  comm::WorkPtr w = group_.send(keep, peer, tag);
  sends_.emplace_back(std::move(keep), std::move(w));
}

void P2PCommunicator::reap() {
  std::vector<std::pair<Tensor, comm::WorkPtr>> left;
  for (auto& s : sends_)
    if (!s.second->is_completed()) left.push_back(std::move(s));
  sends_ = std::move(left);
}

void P2PCommunicator::wait_sends() {
  for (auto& s : sends_) s.second->wait();
  sends_.clear();
}

int P2PCommunicator::tag(int64_t microbatch, int stage, int num_stages, bool backward) {
  const int64_t id = (microbatch * num_stages + stage) % 16384;
  return static_cast<int>(id * 2 + (backward ? 1 : 0));
}

}  // namespace mg::pipeline_parallel
