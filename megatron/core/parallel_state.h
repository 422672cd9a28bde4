// Parallel state: how the world's ranks are split into tensor, pipeline, context, expert and data
// parallel groups, exactly as Megatron-Core's parallel_state does (FORMATS.md §4).
//
//   ParallelDims   the sizes (tp, pp, cp, ep, etp, dp) and the rank order, validated against the
//                  world size with messages that show every factor.
//   RankGenerator  Megatron's generator: order "tp-cp-ep-dp-pp" (default) or "tp-cp-ep-pp-dp"
//                  (--use-tp-pp-dp-mapping); the first axis varies fastest; get_ranks("dp-cp")
//                  gives the masked orthogonal groups.
//   ProcessGroups  every group this rank belongs to, created from a Communicator and passed to the
//                  modules explicitly. There are no global getters: two layouts can live in one
//                  process.
// Not here (yet): hierarchical CP groups, partial-DP / multiple distributed-optimizer instances,
// virtual pipeline state, gloo copies (the MPI backend already carries host tensors).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/comm/process_group.h"

namespace mg::parallel_state {

using RankGroups = std::vector<std::vector<int>>;

inline constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";
inline constexpr std::string_view kTpPpDpOrder = "tp-cp-ep-pp-dp";  // --use-tp-pp-dp-mapping

struct ParallelDims {
  int tp = 1;   // --tensor-model-parallel-size
  int pp = 1;   // --pipeline-model-parallel-size
  int cp = 1;   // --context-parallel-size
  int ep = 1;   // --expert-model-parallel-size
  int etp = 0;  // --expert-tensor-parallel-size; 0: the same as tp
  int dp = 0;   // data parallel size; 0: world / (tp * pp * cp)
  std::string order{kDefaultOrder};

  // This layout checked against the world size, with dp and etp filled in. Throws mg::Error
  // naming every factor when the sizes do not divide the world, a given dp does not match, the
  // order is not a permutation of tp, cp, ep, dp, pp (missing axes are appended), or Megatron would
  // refuse it (expert and dense pipeline groups differ; a pp-not-last order with a different
  // expert data-parallel size).
  ParallelDims resolved(int world_size) const;

  // After resolved(): the sizes Megatron derives.
  int world_size() const { return tp * pp * cp * dp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  int expert_dp() const { return world_size() / (expert_tp() * ep * pp); }
  // "tp 2 x cp 1 x dp 2 x pp 2 (ep 1, etp 2, expert dp 4), order tp-cp-ep-dp-pp"
  std::string str() const;
};

// Megatron's generate_masked_orthogonal_rank_groups: the groups spanning the masked axes.
RankGroups generate_masked_orthogonal_rank_groups(int world_size,
                                                  const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

// Megatron's RankGenerator (megatron/core/parallel_state.py), same arguments and results.
class RankGenerator {
 public:
  RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order,
                int rank_offset = 0);
  // Groups for a token like "tp", "dp-cp", "tp-ep-pp" (axes joined by '-', any order).
  RankGroups get_ranks(std::string_view token) const;
  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }  // completed: every axis present

 private:
  std::vector<std::string> axes_;  // the order's tokens
  std::vector<int> sizes_;         // their sizes
  std::string order_;
  int world_size_ = 1;
  int rank_offset_ = 0;
};

// The embedding group of one pipeline group: its first and last stage ([first] when PP = 1).
std::vector<int> default_embedding_ranks(const std::vector<int>& pp_ranks);
// The position-embedding group of one pipeline group: its first stage.
std::vector<int> default_position_embedding_ranks(const std::vector<int>& pp_ranks);

struct LayoutOptions {
  // Per pipeline group (global ranks), the ranks of its embedding / position-embedding group;
  // empty functions: the defaults above (pretrain_gpt adds MTP stages, drops the last stage when
  // embeddings are untied).
  std::function<std::vector<int>(const std::vector<int>&)> embedding_ranks;
  std::function<std::vector<int>(const std::vector<int>&)> position_embedding_ranks;
};

// Every group Megatron creates for `dims` (resolved against world_size), by name: "tp", "pp", "dp",
// "dp-cp", "cp", "mp" (tp-pp), "tp-dp", "tp-cp", "tp-dp-cp", "embedding", "position-embedding"
// from the dense generator; "ep", "expert-tp", "expert-dp", "tp-ep", "tp-ep-pp" from the expert
// one.
std::map<std::string, RankGroups> rank_layout(const ParallelDims& dims, int world_size,
                                              const LayoutOptions& options = {});

// The groups of this rank. Every member is set on every rank except embedding and
// position_embedding, which are null on ranks outside them.
struct ProcessGroups {
  ParallelDims dims;  // resolved
  comm::ProcessGroupPtr world;
  comm::ProcessGroupPtr tp, pp, dp, dp_cp, cp, mp, tp_dp, tp_cp, tp_dp_cp;
  comm::ProcessGroupPtr embedding, position_embedding;
  comm::ProcessGroupPtr ep, expert_tp, expert_dp, tp_ep, tp_ep_pp;

  bool is_pipeline_first_stage() const { return pp->rank() == 0; }
  bool is_pipeline_last_stage() const { return pp->rank() == pp->size() - 1; }
  // The group by its rank_layout name ("dp-cp", ...); throws listing the names when unknown.
  const comm::ProcessGroupPtr& get(std::string_view name) const;
};

// Creates every group of rank_layout(dims, comm.world_size()) (a collective over the world: every
// rank calls it with the same arguments), each with the communicator's default timeout.
ProcessGroups make_process_groups(comm::Communicator& comm, const ParallelDims& dims,
                                  const LayoutOptions& options = {});

}  // namespace mg::parallel_state
