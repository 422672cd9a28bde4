// Context-parallel core attention (ring p2p and all-gather) and the per-rank sequence slicing
// (context_parallel.h). Activation gradients are written (=); there are no parameters.
#include "megatron/core/transformer/context_parallel.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"

namespace mg::transformer {

std::string_view cp_comm_type_name(CpCommType t) {
  switch (t) {
    case CpCommType::p2p:
      return "p2p";
    case CpCommType::a2a:
      return "a2a";
    case CpCommType::allgather:
      return "allgather";
  }
  return "?";
}

CpCommType parse_cp_comm_type(std::string_view s) {
  if (s == "p2p") return CpCommType::p2p;
  if (s == "a2a") return CpCommType::a2a;
  if (s == "allgather") return CpCommType::allgather;
  MG_THROW("--cp-comm-type " << std::string(s) << " is not one of p2p, a2a, allgather");
}

Tensor slice_sequence_for_cp_rank(const Tensor& x, int cp_rank, int cp_size) {
  MG_CHECK(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size,
           "slice_sequence_for_cp_rank: rank " << cp_rank << " of " << cp_size);
  if (cp_size == 1) return x;
  MG_CHECK(x.dim() == 2, "slice_sequence_for_cp_rank: expected [B, S], got " << x.str());
  const int64_t b = x.size(0), s = x.size(1), parts = 2 * static_cast<int64_t>(cp_size);
  MG_CHECK(s % parts == 0, "context parallelism: the sequence length "
                               << s << " is not divisible by 2 x --context-parallel-size = "
                               << parts << " (each CP rank keeps 2 chunks of S / (2 CP) tokens)");
  const int64_t c = s / parts, es = static_cast<int64_t>(dtype_size(x.dtype()));
  const Tensor h = x.is_host() ? x : x.to(Device::cpu());
  Tensor out = Tensor::empty({b, 2 * c}, x.dtype(), Device::cpu());
  const auto* src = static_cast<const std::byte*>(h.raw_data());
  auto* dst = static_cast<std::byte*>(out.raw_data());
  const int64_t chunks[2] = {cp_rank, parts - 1 - cp_rank};
  for (int64_t row = 0; row < b; ++row)
    for (int half = 0; half < 2; ++half)
      std::memcpy(dst + (row * 2 * c + half * c) * es, src + (row * s + chunks[half] * c) * es,
                  static_cast<std::size_t>(c * es));
  return x.is_host() ? out : out.to(x.device());
}

namespace {

// Global index of local chunk `local` (0 or 1) of CP rank `rank`.
int64_t global_chunk(int64_t rank, int local, int64_t cp) {
  return local == 0 ? rank : 2 * cp - 1 - rank;
}

enum class PairKind : uint8_t { none, full, causal };

// What query chunk gq sees of key chunk gk.
PairKind pair_kind(bool causal, int64_t gq, int64_t gk) {
  if (!causal || gk < gq) return PairKind::full;
  return gk == gq ? PairKind::causal : PairKind::none;
}

// Document ids [B, 2C] (device) -> chunk-major [2, B, C] on the same device (a view per chunk).
Tensor chunk_major_ids(const Tensor& ids) {
  const int64_t b = ids.size(0), c = ids.size(1) / 2;
  const std::vector<int32_t> h = ids.to_vector<int32_t>();
  std::vector<int32_t> o(h.size());
  for (int64_t half = 0; half < 2; ++half)
    for (int64_t row = 0; row < b; ++row)
      for (int64_t j = 0; j < c; ++j) o[(half * b + row) * c + j] = h[row * 2 * c + half * c + j];
  return Tensor::from_vector(o, {2, b, c}, DType::i32).to(ids.device());
}

struct Setup {
  int64_t cp, rank, c, b, nh;
  Tensor ids;  // chunk-major [2, B, C] i32, or undefined without a document mask
};

Setup setup(const char* op, const ContextParallel& cp, const Tensor& q, const Tensor& k,
            const ops::AttentionArgs& a) {
  MG_CHECK(cp.active(), op << ": no context-parallel group");
  MG_CHECK(!a.cu_seqlens.defined(), op << ": cu_seqlens masks are not supported with context "
                                          "parallelism (give doc_ids)");
  MG_CHECK(!a.kv_doc_ids.defined(), op << ": kv_doc_ids are set by context parallelism itself");
  MG_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(0) % 2 == 0,
           op << ": q " << q.str() << ", k " << k.str()
              << " must hold this rank's two equal sequence chunks");
  Setup s{cp.group->size(), cp.group->rank(), q.size(0) / 2, q.size(1), q.size(2), Tensor()};
  if (a.doc_ids.defined()) {
    MG_CHECK(a.doc_ids.shape() == (Shape{s.b, 2 * s.c}), op << ": doc_ids " << a.doc_ids.str()
                                                            << " is not [B, 2C] = [" << s.b << ", "
                                                            << 2 * s.c << "]");
    s.ids = chunk_major_ids(a.doc_ids.to(DType::i32));
  }
  return s;
}

// The arguments of one (query chunk gq, key chunk gk) block attention.
ops::AttentionArgs block_args(const ops::AttentionArgs& a, const Setup& st, PairKind kind,
                              int64_t gq, int64_t gk, int64_t sk, const Tensor& qids,
                              const Tensor& kids) {
  ops::AttentionArgs r;
  r.causal = kind == PairKind::causal;
  r.softmax_scale = a.softmax_scale;
  r.dropout = a.dropout;
  // Each pair of global chunks draws dropout bits from its own counter range.
  r.dropout.offset += static_cast<uint64_t>((gq * 2 * st.cp + gk) * st.b * st.nh * st.c * sk);
  if (qids.defined()) {
    r.doc_ids = qids;
    r.kv_doc_ids = kids;
  }
  return r;
}

// ---- p2p ring ---------------------------------------------------------------------------------

// A K/V block on its way round the ring, with its tokens' document ids (chunk-major).
struct KvBlock {
  Tensor k, v, ids;
  KvBlock like() const {
    return {Tensor::empty(k.shape(), k.dtype(), k.device()),
            Tensor::empty(v.shape(), v.dtype(), v.device()),
            ids.defined() ? Tensor::empty(ids.shape(), ids.dtype(), ids.device()) : Tensor()};
  }
};

constexpr int kTagK = 0, kTagV = 1, kTagIds = 2, kTagDk = 3, kTagDv = 4;

// Sends `send` to the next rank and receives `recv` from the previous one (async).
comm::WorkPtr ring_exchange(comm::ProcessGroup& g, const std::vector<std::pair<Tensor, int>>& send,
                            const std::vector<std::pair<Tensor, int>>& recv) {
  const int p = g.size(), r = g.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  std::vector<comm::P2POp> ops;
  for (const auto& [t, tag] : send) ops.push_back({comm::P2POp::Kind::send, t, next, tag});
  for (const auto& [t, tag] : recv) ops.push_back({comm::P2POp::Kind::recv, t, prev, tag});
  return g.batch_isend_irecv(ops);
}

comm::WorkPtr pass_kv(comm::ProcessGroup& g, const KvBlock& cur, KvBlock& nxt) {
  std::vector<std::pair<Tensor, int>> send{{cur.k, kTagK}, {cur.v, kTagV}};
  std::vector<std::pair<Tensor, int>> recv{{nxt.k, kTagK}, {nxt.v, kTagV}};
  if (cur.ids.defined()) {
    send.emplace_back(cur.ids, kTagIds);
    recv.emplace_back(nxt.ids, kTagIds);
  }
  return ring_exchange(g, send, recv);
}

// Calls f(qc, kc, kind, block args) for every block of step `step` (K/V of rank src).
template <typename F>
void for_each_block(const ops::AttentionArgs& a, const Setup& st, int64_t src, const Tensor& kids,
                    F&& f) {
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t gq = global_chunk(st.rank, qc, st.cp);
    for (int kc = 0; kc < 2; ++kc) {
      const int64_t gk = global_chunk(src, kc, st.cp);
      const PairKind kind = pair_kind(a.causal, gq, gk);
      if (kind == PairKind::none) continue;
      const Tensor qi = st.ids.defined() ? st.ids.select(qc) : Tensor();
      const Tensor ki = kids.defined() ? kids.select(kc) : Tensor();
      f(qc, kc, block_args(a, st, kind, gq, gk, st.c, qi, ki));
    }
  }
}

void ring_fwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& out,
              Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
              const ops::AttentionArgs& a) {
  const int64_t c = st.c;
  KvBlock cur{k, v, st.ids};
  bool started[2] = {false, false};
  Tensor tmp_out = Tensor::empty({c, st.b, st.nh, q.size(3)}, q.dtype(), q.device());
  Tensor tmp_lse = Tensor::empty({st.b, st.nh, c}, lse.dtype(), lse.device());
  for (int64_t step = 0; step < st.cp; ++step) {
    const int64_t src = (st.rank - step + st.cp) % st.cp;
    KvBlock nxt;
    comm::WorkPtr w;
    if (step + 1 < st.cp) {  // the next block travels while this one is computed
      nxt = cur.like();
      w = pass_kv(*cp.group, cur, nxt);
    }
    for_each_block(a, st, src, cur.ids, [&](int qc, int kc, const ops::AttentionArgs& ba) {
      const Tensor qv = q.slice(qc * c, c), kv = cur.k.slice(kc * c, c),
                   vv = cur.v.slice(kc * c, c);
      Tensor o = out.slice(qc * c, c), l = lse.select(qc);
      if (!started[qc]) {
        ops.attention_fwd(o, l, qv, kv, vv, ba);
        started[qc] = true;
      } else {
        ops.attention_fwd(tmp_out, tmp_lse, qv, kv, vv, ba);
        ops.attention_merge(o, l, tmp_out, tmp_lse);
      }
    });
    if (w) {
      w->wait();
      cur = std::move(nxt);
    }
  }
  for (int qc = 0; qc < 2; ++qc) {  // (cannot happen: step 0 holds the diagonal; kept for safety)
    if (started[qc]) continue;
    Tensor o = out.slice(qc * c, c), l = lse.select(qc);
    ops.fill(o, 0.0);
    ops.fill(l, -std::numeric_limits<double>::infinity());
  }
}

void ring_bwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& dq,
              Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionArgs& a) {
  const int64_t c = st.c;
  KvBlock cur{k, v, st.ids};
  ops.fill(dq, 0.0);
  Tensor dq_t = Tensor::empty(q.slice(0, c).shape(), q.dtype(), q.device());
  Tensor dk_t = Tensor::empty(k.slice(0, c).shape(), k.dtype(), k.device());
  Tensor dv_t = Tensor::empty(dk_t.shape(), k.dtype(), k.device());
  // dK/dV of the block held at this step: what earlier holders computed, arriving from the
  // previous rank (dkv_in, once dkv_w completes), plus this rank's part; then passed on. After the
  // last step the block is the next rank's own, so each rank receives its complete dK/dV.
  Tensor dk_in, dv_in, dk_sent, dv_sent;
  comm::WorkPtr dkv_w;
  for (int64_t step = 0; step < st.cp; ++step) {
    const int64_t src = (st.rank - step + st.cp) % st.cp;
    KvBlock nxt;
    comm::WorkPtr w;
    if (step + 1 < st.cp) {
      nxt = cur.like();
      w = pass_kv(*cp.group, cur, nxt);
    }
    Tensor sdk = Tensor::zeros(k.shape(), k.dtype(), k.device());
    Tensor sdv = Tensor::zeros(v.shape(), v.dtype(), v.device());
    for_each_block(a, st, src, cur.ids, [&](int qc, int kc, const ops::AttentionArgs& ba) {
      ops.attention_bwd(dq_t, dk_t, dv_t, dout.slice(qc * c, c), q.slice(qc * c, c),
                        cur.k.slice(kc * c, c), cur.v.slice(kc * c, c), out.slice(qc * c, c),
                        lse.select(qc), ba);
      Tensor dqc = dq.slice(qc * c, c), dkc = sdk.slice(kc * c, c), dvc = sdv.slice(kc * c, c);
      ops.axpy(dqc, dq_t, 1.0f);
      ops.axpy(dkc, dk_t, 1.0f);
      ops.axpy(dvc, dv_t, 1.0f);
    });
    if (dkv_w) {
      dkv_w->wait();
      ops.axpy(dk_in, sdk, 1.0f);
      ops.axpy(dv_in, sdv, 1.0f);
      sdk = dk_in;
      sdv = dv_in;
    }
    dk_sent = sdk;  // kept alive until the exchange completes
    dv_sent = sdv;
    dk_in = Tensor::empty(k.shape(), k.dtype(), k.device());
    dv_in = Tensor::empty(v.shape(), v.dtype(), v.device());
    dkv_w = ring_exchange(*cp.group, {{dk_sent, kTagDk}, {dv_sent, kTagDv}},
                          {{dk_in, kTagDk}, {dv_in, kTagDv}});
    if (w) {
      w->wait();
      cur = std::move(nxt);
    }
  }
  dkv_w->wait();
  dk.copy_(dk_in);
  dv.copy_(dv_in);
}

// ---- all-gather / all-to-all shared: the whole sequence's document ids
// ---------------------------

// Doc ids of the whole sequence [B, 2 CP C] (sequence order) from every rank's chunk-major ids.
std::vector<int32_t> gather_sequence_ids(const ContextParallel& cp, const Setup& st) {
  const int64_t p = st.cp, c = st.c, n = 2 * p * c;
  Tensor all = Tensor::empty({2 * p, st.b, c}, DType::i32, st.ids.device());
  cp.group->all_gather(all, st.ids)->wait();
  const std::vector<int32_t> h = all.to_vector<int32_t>();
  std::vector<int32_t> o(static_cast<std::size_t>(st.b * n));
  for (int64_t g = 0; g < 2 * p; ++g) {
    const int64_t rank = g < p ? g : 2 * p - 1 - g, slot = rank * 2 + (g < p ? 0 : 1);
    for (int64_t row = 0; row < st.b; ++row)
      for (int64_t j = 0; j < c; ++j) o[row * n + g * c + j] = h[(slot * st.b + row) * c + j];
  }
  return o;
}

// ---- all-gather -------------------------------------------------------------------------------

// Rows of global chunk g in the all-gathered (rank-major) layout [CP * 2C, ...].
int64_t gathered_row(int64_t g, int64_t cp, int64_t c) {
  const int64_t rank = g < cp ? g : 2 * cp - 1 - g, half = g < cp ? 0 : 1;
  return (rank * 2 + half) * c;
}

// The all-gathered x [CP * 2C, ...] in sequence order (to_sequence) or back (!to_sequence).
void reorder(Tensor& dst, const Tensor& src, int64_t cp, int64_t c, bool to_sequence) {
  for (int64_t g = 0; g < 2 * cp; ++g) {
    const int64_t at = gathered_row(g, cp, c);
    Tensor d = dst.slice(to_sequence ? g * c : at, c);
    d.copy_(src.slice(to_sequence ? at : g * c, c));
  }
}

struct Gathered {
  Tensor k, v;                 // [2 CP C, B, NG, HD] in sequence order
  std::vector<Tensor> kv_ids;  // per local query chunk: the ids of its keys [B, Sk], or empty
};

Gathered gather_kv(const ContextParallel& cp, const Setup& st, const Tensor& k, const Tensor& v,
                   bool causal) {
  const int64_t p = st.cp, c = st.c, n = 2 * p * c;
  Shape full = k.shape();
  full[0] = n;
  Tensor kall = Tensor::empty(full, k.dtype(), k.device());
  Tensor vall = Tensor::empty(full, v.dtype(), v.device());
  auto wk = cp.group->all_gather(kall, k);
  auto wv = cp.group->all_gather(vall, v);
  Gathered g;
  if (st.ids.defined()) {  // chunk-major [2, B, C] per rank -> [B, Sk] per query chunk
    Tensor all = Tensor::empty({2 * p, st.b, c}, DType::i32, st.ids.device());
    cp.group->all_gather(all, st.ids)->wait();
    const std::vector<int32_t> h = all.to_vector<int32_t>();
    for (int qc = 0; qc < 2; ++qc) {
      const int64_t gq = global_chunk(st.rank, qc, p), sk = causal ? (gq + 1) * c : n;
      std::vector<int32_t> o(static_cast<std::size_t>(st.b * sk));
      for (int64_t row = 0; row < st.b; ++row)
        for (int64_t j = 0; j < sk; ++j) {
          const int64_t gc = j / c, at = gathered_row(gc, p, c) / c;  // chunk slot in `all`
          o[row * sk + j] = h[(at * st.b + row) * c + j % c];
        }
      g.kv_ids.push_back(Tensor::from_vector(o, {st.b, sk}, DType::i32).to(k.device()));
    }
  }
  wk->wait();
  wv->wait();
  g.k = Tensor::empty(full, k.dtype(), k.device());
  g.v = Tensor::empty(full, v.dtype(), v.device());
  reorder(g.k, kall, p, c, true);
  reorder(g.v, vall, p, c, true);
  return g;
}

// The arguments of local query chunk qc against its key prefix [0, sk) of the sequence.
ops::AttentionArgs prefix_args(const ops::AttentionArgs& a, const Setup& st, const Gathered& g,
                               int qc, int64_t gq, int64_t /*sk*/) {
  ops::AttentionArgs r;
  r.causal = a.causal;  // bottom-right aligned: query i of chunk gq is token gq C + i
  r.softmax_scale = a.softmax_scale;
  r.dropout = a.dropout;
  r.dropout.offset += static_cast<uint64_t>(gq * st.b * st.nh * st.c * 2 * st.cp * st.c);
  if (st.ids.defined()) {
    r.doc_ids = st.ids.select(qc);
    r.kv_doc_ids = g.kv_ids[static_cast<std::size_t>(qc)];
  }
  return r;
}

int64_t prefix_len(const ops::AttentionArgs& a, const Setup& st, int64_t gq) {
  return a.causal ? (gq + 1) * st.c : 2 * st.cp * st.c;
}

void allgather_fwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& out,
                   Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const ops::AttentionArgs& a) {
  const Gathered g = gather_kv(cp, st, k, v, a.causal);
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t gq = global_chunk(st.rank, qc, st.cp), sk = prefix_len(a, st, gq);
    Tensor o = out.slice(qc * st.c, st.c), l = lse.select(qc);
    ops.attention_fwd(o, l, q.slice(qc * st.c, st.c), g.k.slice(0, sk), g.v.slice(0, sk),
                      prefix_args(a, st, g, qc, gq, sk));
  }
}

void allgather_bwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& dq,
                   Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& out, const Tensor& lse,
                   const ops::AttentionArgs& a) {
  const Gathered g = gather_kv(cp, st, k, v, a.causal);
  Tensor dks = Tensor::zeros(g.k.shape(), k.dtype(), k.device());
  Tensor dvs = Tensor::zeros(g.v.shape(), v.dtype(), v.device());
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t gq = global_chunk(st.rank, qc, st.cp), sk = prefix_len(a, st, gq);
    Tensor dqc = dq.slice(qc * st.c, st.c);
    Tensor dk_t = Tensor::empty(g.k.slice(0, sk).shape(), k.dtype(), k.device());
    Tensor dv_t = Tensor::empty(dk_t.shape(), v.dtype(), v.device());
    ops.attention_bwd(dqc, dk_t, dv_t, dout.slice(qc * st.c, st.c), q.slice(qc * st.c, st.c),
                      g.k.slice(0, sk), g.v.slice(0, sk), out.slice(qc * st.c, st.c),
                      lse.select(qc), prefix_args(a, st, g, qc, gq, sk));
    Tensor dkp = dks.slice(0, sk), dvp = dvs.slice(0, sk);
    ops.axpy(dkp, dk_t, 1.0f);
    ops.axpy(dvp, dv_t, 1.0f);
  }
  // Back to the rank-major layout, then each rank's two chunks summed over the group.
  Tensor dk_all = Tensor::empty(dks.shape(), k.dtype(), k.device());
  Tensor dv_all = Tensor::empty(dvs.shape(), v.dtype(), v.device());
  reorder(dk_all, dks, st.cp, st.c, false);
  reorder(dv_all, dvs, st.cp, st.c, false);
  auto wk = cp.group->reduce_scatter(dk, dk_all, comm::ReduceOp::sum);
  auto wv = cp.group->reduce_scatter(dv, dv_all, comm::ReduceOp::sum);
  wk->wait();
  wv->wait();
}

// ---- all-to-all (Ulysses) ----------------------------------------------------------------------
//
// Heads are split across CP: rank j attends, over the whole sequence, heads [j H/CP, (j+1) H/CP)
// (whole KV groups: NG % CP == 0), so core attention is one causal call and lse is [B, NH/CP, S].

// x [2C, B, H, HD] (this rank's chunks, every head) -> [2 CP C, B, H/CP, HD] (the whole sequence in
// order, this rank's heads).
Tensor heads_to_sequence(const ContextParallel& cp, const Setup& st, const Tensor& x) {
  const int64_t p = st.cp, c = st.c, hp = x.size(2) / p, hd = x.size(3);
  Tensor send = Tensor::empty({p * 2 * c, st.b, hp, hd}, x.dtype(), x.device());
  for (int64_t j = 0; j < p; ++j)
    for (int64_t s = 0; s < 2 * c; ++s)
      for (int64_t b = 0; b < st.b; ++b) {
        Tensor d = send.select(j * 2 * c + s).select(b);
        d.copy_(x.select(s).select(b).slice(j * hp, hp));
      }
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device());
  cp.group->all_to_all(recv, send)->wait();  // chunk j: rank j's two chunks, this rank's heads
  Tensor seq = Tensor::empty(send.shape(), x.dtype(), x.device());
  reorder(seq, recv, p, c, true);
  return seq;
}

// The inverse: x_seq [2 CP C, B, H/CP, HD] -> out [2C, B, H, HD] (written).
void sequence_to_heads(const ContextParallel& cp, const Setup& st, Tensor& out, const Tensor& x) {
  const int64_t p = st.cp, c = st.c, hp = x.size(2);
  Tensor send = Tensor::empty(x.shape(), x.dtype(), x.device());
  reorder(send, x, p, c, false);  // rank-major: chunk j holds rank j's two chunks
  Tensor recv = Tensor::empty(x.shape(), x.dtype(), x.device());
  cp.group->all_to_all(recv, send)->wait();  // chunk j: this rank's chunks, rank j's heads
  for (int64_t j = 0; j < p; ++j)
    for (int64_t s = 0; s < 2 * c; ++s)
      for (int64_t b = 0; b < st.b; ++b) {
        Tensor d = out.select(s).select(b).slice(j * hp, hp);
        d.copy_(recv.select(j * 2 * c + s).select(b));
      }
}

ops::AttentionArgs a2a_args(const ContextParallel& cp, const Setup& st, const ops::AttentionArgs& a,
                            const Tensor& like) {
  ops::AttentionArgs r;
  r.causal = a.causal;
  r.softmax_scale = a.softmax_scale;
  r.dropout = a.dropout;
  const int64_t n = 2 * st.cp * st.c;
  r.dropout.offset += static_cast<uint64_t>(st.rank * st.b * (st.nh / st.cp) * n * n);
  if (st.ids.defined())
    r.doc_ids =
        Tensor::from_vector(gather_sequence_ids(cp, st), {st.b, n}, DType::i32).to(like.device());
  return r;
}

void a2a_check(const Setup& st, const Tensor& k) {
  MG_CHECK(st.nh % st.cp == 0 && k.size(2) % st.cp == 0,
           "--cp-comm-type a2a splits heads across CP: this rank's " << st.nh << " heads and "
                                                                     << k.size(2)
                                                                     << " query groups must be "
                                                                        "divisible by CP = "
                                                                     << st.cp);
}

void a2a_fwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& out,
             Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
             const ops::AttentionArgs& a) {
  a2a_check(st, k);
  const Tensor qs = heads_to_sequence(cp, st, q), ks = heads_to_sequence(cp, st, k),
               vs = heads_to_sequence(cp, st, v);
  Tensor os = Tensor::empty(qs.shape(), q.dtype(), q.device());
  ops.attention_fwd(os, lse, qs, ks, vs, a2a_args(cp, st, a, q));
  sequence_to_heads(cp, st, out, os);
}

void a2a_bwd(const ops::OpTable& ops, const ContextParallel& cp, const Setup& st, Tensor& dq,
             Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
             const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionArgs& a) {
  a2a_check(st, k);
  const Tensor qs = heads_to_sequence(cp, st, q), ks = heads_to_sequence(cp, st, k),
               vs = heads_to_sequence(cp, st, v), os = heads_to_sequence(cp, st, out),
               dos = heads_to_sequence(cp, st, dout);
  Tensor dqs = Tensor::empty(qs.shape(), q.dtype(), q.device());
  Tensor dks = Tensor::empty(ks.shape(), k.dtype(), k.device());
  Tensor dvs = Tensor::empty(vs.shape(), v.dtype(), v.device());
  ops.attention_bwd(dqs, dks, dvs, dos, qs, ks, vs, os, lse, a2a_args(cp, st, a, q));
  sequence_to_heads(cp, st, dq, dqs);
  sequence_to_heads(cp, st, dk, dks);
  sequence_to_heads(cp, st, dv, dvs);
}

}  // namespace

Shape cp_lse_shape(const ContextParallel& cp, int64_t s, int64_t b, int64_t nh) {
  if (!cp.active()) return {b, nh, s};
  const int64_t p = cp.group->size();
  if (cp.comm_type == CpCommType::a2a) return {b, nh / p, s * p};
  return {2, b, nh, s / 2};
}

void cp_attention_fwd(const ops::OpTable& ops, const ContextParallel& cp, Tensor& out, Tensor& lse,
                      const Tensor& q, const Tensor& k, const Tensor& v,
                      const ops::AttentionArgs& args) {
  const Setup st = setup("cp_attention_fwd", cp, q, k, args);
  MG_CHECK(out.shape() == q.shape() && lse.shape() == cp_lse_shape(cp, 2 * st.c, st.b, st.nh),
           "cp_attention_fwd: out " << out.str() << " must be like q " << q.str() << ", lse "
                                    << lse.str() << " like cp_lse_shape");
  if (cp.comm_type == CpCommType::a2a)
    a2a_fwd(ops, cp, st, out, lse, q, k, v, args);
  else if (cp.comm_type == CpCommType::allgather)
    allgather_fwd(ops, cp, st, out, lse, q, k, v, args);
  else
    ring_fwd(ops, cp, st, out, lse, q, k, v, args);
}

void cp_attention_bwd(const ops::OpTable& ops, const ContextParallel& cp, Tensor& dq, Tensor& dk,
                      Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& lse,
                      const ops::AttentionArgs& args) {
  const Setup st = setup("cp_attention_bwd", cp, q, k, args);
  MG_CHECK(lse.shape() == cp_lse_shape(cp, 2 * st.c, st.b, st.nh),
           "cp_attention_bwd: lse " << lse.str() << " is not like cp_lse_shape");
  if (cp.comm_type == CpCommType::a2a)
    a2a_bwd(ops, cp, st, dq, dk, dv, dout, q, k, v, out, lse, args);
  else if (cp.comm_type == CpCommType::allgather)
    allgather_bwd(ops, cp, st, dq, dk, dv, dout, q, k, v, out, lse, args);
  else
    ring_bwd(ops, cp, st, dq, dk, dv, dout, q, k, v, out, lse, args);
}

}  // namespace mg::transformer
