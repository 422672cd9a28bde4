// The single-rank backend: a world of one process, no MPI needed. Every group has size 1, so each
// collective is a copy (or nothing) after the same argument checks as the other backends; sends to
// self are queued and matched by recvs of the same tag, in order. Works on any device (copies go
// through Tensor::copy_). Every Work is complete when returned.
#include <deque>
#include <map>

#include "megatron/core/comm/backends.h"
#include "megatron/core/comm/checks.h"

namespace mg::comm::detail {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

WorkPtr done() {
  return std::make_unique<DoneWork>();
}

// Flat [n] view of the first n elements.
Tensor flat_prefix(const Tensor& t, int64_t n) {
  return t.view({t.numel()}).slice(0, n);
}

class SingleGroup final : public ProcessGroup {
 public:
  SingleGroup(std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "single"; }

  WorkPtr all_reduce(Tensor& x, ReduceOp op) override {
    check_all_reduce(*this, x, op);  // avg over one member: x / 1 == x exactly
    return done();
  }
  WorkPtr all_gather(Tensor& out, const Tensor& in) override {
    check_all_gather(*this, out, in);
    if (!same_view(out, in)) out.copy_(in);
    return done();
  }
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    check_reduce_scatter(*this, out, in, op);
    if (!same_view(out, in)) out.copy_(in);
    return done();
  }
  WorkPtr broadcast(Tensor& x, int root) override {
    check_broadcast(*this, x, root);
    return done();
  }
  WorkPtr all_to_all(Tensor& out, const Tensor& in) override {
    check_all_to_all(*this, out, in);
    if (!same_view(out, in)) out.copy_(in);
    return done();
  }
  WorkPtr all_to_all_v(Tensor& out, const Tensor& in, std::span<const int64_t> send_counts,
                       std::span<const int64_t> recv_counts) override {
    check_all_to_all_v(*this, out, in, send_counts, recv_counts);
    MG_CHECK(send_counts[0] == recv_counts[0],
             "all_to_all_v on " << describe(*this) << ": sends " << send_counts[0]
                                << " elements to itself but expects to receive " << recv_counts[0]);
    if (send_counts[0] > 0 && !same_view(out, in)) {
      flat_prefix(out, recv_counts[0]).copy_(flat_prefix(in, send_counts[0]));
    }
    return done();
  }
  WorkPtr send(const Tensor& x, int peer, int tag) override {
    check_p2p(*this, "send", x, peer, tag);
    mailbox_[tag].push_back(x.clone());
    return done();
  }
  WorkPtr recv(Tensor& x, int peer, int tag) override {
    check_p2p(*this, "recv", x, peer, tag);
    auto it = mailbox_.find(tag);
    MG_CHECK(it != mailbox_.end() && !it->second.empty(),
             "recv on " << describe(*this) << ": no send to self with tag " << tag
                        << " is pending; on one rank a recv would wait forever");
    Tensor src = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) mailbox_.erase(it);
    MG_CHECK(src.numel() == x.numel() && src.dtype() == x.dtype(),
             "recv on " << describe(*this) << ": tag " << tag << " got " << src.str() << " into "
                        << x.str());
    x.copy_(src);
    return done();
  }
  WorkPtr batch_isend_irecv(std::span<const P2POp> ops) override {
    // Sends first, so that a ring of one (send to self, recv from self) matches in any order.
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::send) send(op.tensor, op.peer, op.tag);
    }
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::recv) {
        Tensor t = op.tensor;
        recv(t, op.peer, op.tag);
      }
    }
    return done();
  }
  void barrier() override {}
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  static bool same_view(const Tensor& a, const Tensor& b) {
    return a.shares_storage_with(b) && a.offset_bytes() == b.offset_bytes();
  }

  std::string name_;
  std::vector<int> ranks_{0};
  std::chrono::milliseconds timeout_;
  std::map<int, std::deque<Tensor>> mailbox_;
};

class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator() : world_(std::make_shared<SingleGroup>("world", default_timeout_)) {}
  int world_rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view backend() const override { return "single"; }
  ProcessGroupPtr world() override { return world_; }
  ProcessGroupPtr new_groups(const std::vector<std::vector<int>>& groups,
                             const std::string& name) override {
    check_partition(groups, 1, name);
    if (groups.empty()) return nullptr;
    return std::make_shared<SingleGroup>(name, default_timeout_);
  }

 private:
  ProcessGroupPtr world_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace mg::comm::detail
