// Point-to-point exchange of hidden states and their gradients between pipeline stages
// (megatron/core/pipeline_parallel/p2p_communication.py), over the pipeline group.
//
// Shapes and dtype are known ahead (Megatron's tensor_shape: [S, B, H], [S/TP, B, H] under
// sequence parallelism), so every receive lands in a fresh tensor allocated up front and can be
// posted before the data is needed (the schedule posts the next step's receive before computing
// the current one). Sends are non-blocking; each sent tensor is kept alive until its send
// completes. Every message carries a tag naming (micro-batch, sending virtual stage, direction),
// so forward activations and backward gradients between the same two ranks (interleaving with
// PP 2 sends both ways) never match the wrong receive. A receive that never arrives fails in the
// group's timeout (Work::wait), naming the group and the peer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"

namespace mg::pipeline_parallel {

class P2PCommunicator {
 public:
  P2PCommunicator(comm::ProcessGroup& pp_group, Shape shape, DType dtype, Device device);
  ~P2PCommunicator();  // waits for the sends still in flight
  P2PCommunicator(const P2PCommunicator&) = delete;
  P2PCommunicator& operator=(const P2PCommunicator&) = delete;

  struct Recv {
    Tensor tensor;
    comm::WorkPtr work;
  };
  // Posts a receive from pipeline rank `peer`; wait() gives the tensor.
  Recv post_recv(int peer, int tag);
  static Tensor wait(Recv& r);
  // Non-blocking send of x (kept alive until done) to pipeline rank `peer`.
  void send(const Tensor& x, int peer, int tag);
  // Waits for every send still in flight.
  void wait_sends();

  // The tag of the message of `microbatch` sent by virtual stage `stage` (of num_stages),
  // forward (activations) or backward (gradients); below 32768 (MPI's guaranteed tag bound).
  static int tag(int64_t microbatch, int stage, int num_stages, bool backward);

 private:
  void reap();  // drops the completed sends
  comm::ProcessGroup& group_;
  Shape shape_;
  DType dtype_;
  Device device_;
  std::vector<std::pair<Tensor, comm::WorkPtr>> sends_;
};

}  // namespace mg::pipeline_parallel
