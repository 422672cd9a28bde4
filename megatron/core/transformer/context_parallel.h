// Context parallelism (Megatron's --context-parallel-size, --cp-comm-type): each sequence is cut
// into 2·CP chunks of C tokens and CP rank r keeps chunks r and 2·CP−1−r (Megatron's load balancing
// for causal attention: every rank gets one early and one late chunk), so its activations are
// [2C, B, H] and everything but core attention is CP-local. Core attention needs every earlier
// key of the sequence; it is computed here across the CP group:
//   p2p        ring attention: K/V (and their document ids) go round the ring, one hop per step,
//              the next block's send/recv in flight while the current block is computed; partial
//              results of each query chunk are merged by their log-sum-exp (ops attention_merge).
//              Backward: the same ring; dK/dV travel with their block and reach its owner after
//              the last step, dQ accumulates locally.
//   allgather  K/V of the whole sequence are all-gathered and put in sequence order; each query
//              chunk attends its prefix (causal, bottom-right aligned); backward reduce-scatters
//              dK/dV.
//   a2a        Ulysses: all-to-all of q/k/v turns "this rank's tokens, every head" into "the whole
//              sequence, heads [r H/CP, (r+1) H/CP)" (whole KV groups: NH and NG divisible by
//              CP), one causal attention call, and the output (backward: dq/dk/dv) goes back the
//              same way. Its lse is [B, NH/CP, S] (this rank's heads, the whole sequence).
// For a query chunk g_q and a key chunk g_k (global chunk indices): g_k < g_q full attention,
// g_k == g_q causal, g_k > g_q nothing (non-causal attention: always full). Per-document masks of
// packed sequences (doc_ids [B, 2C], the local chunks' ids) hold across chunks: a K/V block
// carries its tokens' ids. A query chunk whose tokens attend nothing on some block (all masked)
// gets lse = -inf there and the merge ignores it: results stay finite (PITFALLS.md row 14).
// Layouts: q, out, dq, dout [2C, B, NH, HD]; k, v, dk, dv [2C, B, NG, HD] (this rank's two chunks
// in that order, as the batch slicing gives them); lse (cp_lse_shape) [2, B, NH, C] per local
// chunk over the whole sequence for p2p and allgather, [B, NH/CP, S] for a2a. Attention dropout
// works but its masks differ from a CP = 1 run (each block pair draws from its own counter range).
// cu_seqlens masks are refused (give doc_ids). Not here: the batch slicing of tokens, labels,
// masks and positions (slice_sequence_for_cp_rank below is the tensor helper; training/ applies
// it), the gradient reduction over dp-cp (DDP's group).
#pragma once

#include <cstdint>
#include <string_view>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::transformer {

enum class CpCommType : uint8_t { p2p, a2a, allgather };
std::string_view cp_comm_type_name(CpCommType t);  // "p2p", "a2a", "allgather"
// "p2p" | "a2a" | "allgather"; anything else is an error listing the valid values.
CpCommType parse_cp_comm_type(std::string_view s);

// The CP group and how it communicates, as a module sees it (ModuleContext::cp).
struct ContextParallel {
  comm::ProcessGroup* group = nullptr;  // null or size 1: no context parallelism
  CpCommType comm_type = CpCommType::p2p;
  bool active() const { return group != nullptr && group->size() > 1; }
};

// The lse shape of CP attention for local length s = 2C, batch b and nh heads (cp inactive: the
// attention op's [B, NH, S]).
Shape cp_lse_shape(const ContextParallel& cp, int64_t s, int64_t b, int64_t nh);

// out [2C, B, NH, HD], lse (cp_lse_shape) <- q [2C, B, NH, HD], k, v [2C, B, NG, HD] over the whole
// sequence held by cp.group; args as for attention_fwd (doc_ids [B, 2C]: the local tokens').
void cp_attention_fwd(const ops::OpTable& ops, const ContextParallel& cp, Tensor& out, Tensor& lse,
                      const Tensor& q, const Tensor& k, const Tensor& v,
                      const ops::AttentionArgs& args);
// dq, dk, dv (written) from dout and the forward's out and lse (global, merged).
void cp_attention_bwd(const ops::OpTable& ops, const ContextParallel& cp, Tensor& dq, Tensor& dk,
                      Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& lse,
                      const ops::AttentionArgs& args);

// Megatron's get_batch_on_this_cp_rank for one [B, S] tensor (tokens, labels, loss_mask, position
// ids, doc ids; any dtype, host or device): chunks r and 2·CP−1−r of S / (2·CP) tokens, as
// [B, S / CP]. S must be divisible by 2·CP (an error naming both otherwise).
Tensor slice_sequence_for_cp_rank(const Tensor& x, int cp_rank, int cp_size);

}  // namespace mg::transformer
