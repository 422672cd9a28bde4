// cuDNN fused attention (scaled dot-product attention through the cuDNN frontend's graph API): the
// providers "cuda:cudnn" of attention_fwd / attention_bwd and "cuda:cudnn-deterministic" of
// attention_bwd, Priority::alternative, so they run where the run prefers them
// (--attention-backend auto/fused, or MG_OP_PROVIDERS). Built only when CMake finds the frontend's
// headers and libcudnn (megatron/CMakeLists.txt, MG_WITH_CUDNN).
//
// What cuDNN serves here (the predicates; every other call falls back to our kernels): bf16/f16 q,
// k, v on a device of compute capability >= 8.0, head dim a multiple of 8 up to 256 (the graph's
// check_support decides the rest for this GPU and library), GQA/MQA (K/V with NG heads), causal
// (top-left == bottom-right when Sq == Sk; bottom-right when Sk > Sq; Sk < Sq with causal would
// leave rows that attend nothing and is ours), attention dropout, packed documents given as
// cu_seqlens, 16-byte-aligned pointers. Not served: doc_ids / kv_doc_ids (--reset-attention-mask's
// per-row ids: cuDNN has no per-token document mask; ours run them), cu_seqlens together with
// dropout (each is tested alone; the pair is not yet), and what cuDNN itself refuses
// (e.g. dropout with bottom-right causal, Sk > Sq; cached as unsupported, said once on stderr).
// The layout is Megatron's sbhd ([S, B, heads, HD]), given to cuDNN as strides of a
// (B, heads, S, HD) tensor; lse [B, NH, Sq] f32 is cuDNN's Stats (log-sum-exp of the scaled
// scores, natural log), which the backward reads back and context parallelism merges. Gradients
// are written (=), as every attention backward here.
//
// Dropout (args.dropout.p > 0): cuDNN's own Philox stream, seeded with args.dropout.seed and
// args.dropout.offset (int64 device scalars written on the call's stream, so every call may bring
// new values; they are not part of the graph key, the probability is). The backward regenerates
// the forward's mask from the same (seed, offset). cuDNN's mask is NOT our kernels' mask (ours:
// philox_uniform(seed, offset + ((b*NH + h)*Sq + i)*Sk + j) >= p, the CPU's bit for bit;
// dropout_mask.cuh): the same distribution, other bits. So --attention-backend local reproduces
// the CPU platform's masks bit for bit; fused / auto use cuDNN's RNG stream, as Megatron with
// Transformer Engine does (a run is still reproducible run to run, and its forward and backward
// agree). Context parallelism gives each block its own offset either way.
//
// Packed documents (cu_seqlens [D+1] i32 on the device, shared by every batch row, Sq == Sk): the
// B*D documents are cuDNN's batch of variable-length sequences (padding mask, seq_len_q =
// seq_len_kv = cu[d+1] - cu[d]), sequence n = d*B + b starting at element (cu[d]*B + b)*heads*HD of
// the sbhd tensor (its ragged offset) with S stride B*heads*HD, causal top-left within each
// document. The lengths and offsets are built on the device (cudnn_attention_kernels.cu: no host
// round trip, unlike our kernels; invalid cu_seqlens become a deferred error). cuDNN's Stats stay
// padded
// ([B*D, NH, S] scratch): a small kernel moves them to and from our lse. Needs cuDNN >= 9.6 (int64
// ragged offsets, the backward's max_total_seq_len) and compute capability >= 9.0 (cuDNN's ragged
// layouts); D is part of the graph key (each document count builds its graph once).
//
// Graphs are built once per (device, shape, dtype, mask, scale, dropout probability, documents,
// deterministic) and cached with their workspace size; a shape cuDNN rejects is cached as
// unsupported, so the predicate (asked before every call) costs one map lookup after the first
// call, and says once on stderr why. One cuDNN handle per device, bound to the thread's current
// stream at each call; the workspace and the per-call scratch come from the caching device
// allocator (stream-ordered). The deterministic backward asks cuDNN for its deterministic
// algorithm (no atomics in dQ); "cuda:cudnn" (not deterministic) is dropped by the registry in a
// deterministic run. Test-only: mg_cuda_cudnn_attention_fwd_rng_dump runs a forward that also
// returns cuDNN's dropout mask (its RNG dump), so a test can check the math against that mask.
// The FP8 attention (fp8_attention_fwd / fp8_attention_bwd, cudnn_fp8_attention.cpp) uses this
// file's per-device handles under its lock (cudnn_shared.h); register_cudnn_attention_kernels
// registers it too.
#include "megatron/platforms/cuda/cudnn/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/cudnn/cudnn_attention_kernels.h"
#include "megatron/platforms/cuda/cudnn/cudnn_shared.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {
namespace {

namespace fe = cudnn_frontend;
using ops::AttentionArgs;
using ops::OpId;
using plugin::Priority;

enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeed,
  kOffset,
  kSeqQ,
  kSeqKV,
  kRaggedQ,   // q, out, dout, dq
  kRaggedKV,  // k, v, dk, dv
  kRngDump,
};

struct Key {
  int device;
  bool backward, deterministic, causal, rng_dump;
  DType dtype;
  int64_t b, nh, ng, sq, sk, hd;
  int64_t docs;  // D of cu_seqlens; 0 without
  float scale;
  float dropout;  // the probability; 0 without
  auto tie() const {
    return std::tie(device, backward, deterministic, causal, rng_dump, dtype, b, nh, ng, sq, sk, hd,
                    docs, scale, dropout);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN does not serve this key
  int64_t workspace = 0;
  std::string why;  // the reason when unsupported
};

struct DeviceState {
  cudnnHandle_t handle = nullptr;
  std::string error;  // why no handle (no GPU, no libcudnn, ...)
};

std::mutex g_mu;
std::map<int, DeviceState> g_devices;
std::map<Key, Entry> g_graphs;
CudnnAttentionStats g_stats;  // guarded by g_mu

// The device's handle (created on first use); null with the reason in `why` when cuDNN cannot run.
cudnnHandle_t handle_of(int device, std::string* why) {
  auto [it, fresh] = g_devices.try_emplace(device);
  DeviceState& s = it->second;
  if (fresh) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
      cudaGetLastError();
      s.error = "no CUDA device " + std::to_string(device);
    } else if (device_properties(device).major < 8) {
      s.error = "cuDNN fused attention needs compute capability >= 8.0";
    } else {
      DeviceGuard guard(device);
      const cudnnStatus_t st = cudnnCreate(&s.handle);
      if (st != CUDNN_STATUS_SUCCESS) {
        s.handle = nullptr;
        s.error = std::string("cudnnCreate failed: ") + cudnnGetErrorString(st);
      }
    }
  }
  if (!s.handle && why) *why = s.error;
  return s.handle;
}

fe::DataType_t fe_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The (B, heads, S, HD) view of an sbhd tensor [S, B, heads, HD]; with packed documents the
// (B*D, heads, S, HD) view whose sequence n starts at its ragged offset (the batch stride is then
// unused; it is given as the tensor's extent so that the strides keep sbhd's order).
void set_layout(fe::graph::Tensor_attributes& t, const Key& k, int64_t uid, int64_t heads,
                int64_t s, const TensorAttr& ragged) {
  t.set_uid(uid);
  if (!ragged) {
    t.set_dim({k.b, heads, s, k.hd}).set_stride({heads * k.hd, k.hd, k.b * heads * k.hd, 1});
    return;
  }
  t.set_dim({k.b * k.docs, heads, s, k.hd})
      .set_stride({s * k.b * heads * k.hd, k.hd, k.b * heads * k.hd, 1})
      .set_ragged_offset(ragged);
}
TensorAttr input(fe::graph::Graph& g, const char* name, const Key& k, int64_t uid, int64_t heads,
                 int64_t s, const TensorAttr& ragged) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  set_layout(t, k, uid, heads, s, ragged);
  return g.tensor(t);
}
// A [n, 1, 1, 1] tensor of per-sequence values (lengths, offsets, or the dropout scalars).
TensorAttr column(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n,
                  fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(type));
}

std::string fe_error(const char* what, fe::error_t e) {
  return std::string(what) + ": " + e.get_message();
}

// Why this library / device cannot run the packed-document graph, or "".
std::string packed_refusal(const Key& k) {
  if (cudnnGetVersion() < 90600)
    return "packed documents (cu_seqlens) need cuDNN >= 9.6 here (int64 ragged offsets), this is " +
           std::to_string(cudnnGetVersion());
  if (device_properties(k.device).major < 9)
    return "packed documents (cu_seqlens) need compute capability >= 9.0 (cuDNN's ragged layouts)";
  return "";
}

// Builds the graph of `k` with the forward implementation `impl` (caller holds g_mu); an Entry
// without a graph says why not.
Entry build_with(const Key& k, cudnnHandle_t handle, fe::AttentionImplementation_t impl) {
  Entry e;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t nb = k.docs > 0 ? k.b * k.docs : k.b;  // cuDNN's batch: sequences
  TensorAttr rq, rkv, seq_q, seq_kv, seed, offset;
  if (k.docs > 0) {
    rq = column(*g, "ragged_q", kRaggedQ, nb + 1, fe::DataType_t::INT64);
    rkv = column(*g, "ragged_kv", kRaggedKV, nb + 1, fe::DataType_t::INT64);
    seq_q = column(*g, "seq_len_q", kSeqQ, nb, fe::DataType_t::INT32);
    seq_kv = column(*g, "seq_len_kv", kSeqKV, nb, fe::DataType_t::INT32);
  }
  if (k.dropout > 0.0f) {
    seed = column(*g, "dropout_seed", kSeed, 1, fe::DataType_t::INT64);
    offset = column(*g, "dropout_offset", kOffset, 1, fe::DataType_t::INT64);
  }
  // Within a document Sq == Sk: top-left causal is the contract's (bottom-right) one.
  const bool bottom_right = k.causal && k.docs == 0 && k.sq != k.sk;
  auto q = input(*g, "Q", k, kQ, k.nh, k.sq, rq);
  auto kk = input(*g, "K", k, kK, k.ng, k.sk, rkv);
  auto v = input(*g, "V", k, kV, k.ng, k.sk, rkv);
  auto stats_layout = [&](fe::graph::Tensor_attributes& t) {
    t.set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({nb, k.nh, k.sq, 1})
        .set_stride({k.nh * k.sq, k.sq, 1, 1});
  };
  if (!k.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("mg_sdpa_fwd")
                     .set_generate_stats(true)
                     .set_attn_scale(k.scale)
                     .set_implementation(impl);
    if (k.causal) {
      if (bottom_right)
        attrs.set_causal_mask_bottom_right(true);
      else
        attrs.set_causal_mask(true);
    }
    if (k.docs > 0) attrs.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    if (k.dropout > 0.0f) attrs.set_dropout(k.dropout, seed, offset);
    if (k.rng_dump)
      attrs.set_rng_dump(g->tensor(fe::graph::Tensor_attributes()
                                       .set_name("rng_dump")
                                       .set_uid(kRngDump)
                                       .set_dim({k.b, k.nh, k.sq, k.sk})
                                       .set_stride({k.nh * k.sq * k.sk, k.sq * k.sk, k.sk, 1})
                                       .set_data_type(fe::DataType_t::FLOAT)));
    auto [o, stats] = g->sdpa(q, kk, v, attrs);
    o->set_output(true);
    set_layout(*o, k, kO, k.nh, k.sq, rq);
    stats->set_output(true);
    stats_layout(*stats);
  } else {
    auto o = input(*g, "O", k, kO, k.nh, k.sq, rq);
    auto dO = input(*g, "dO", k, kDO, k.nh, k.sq, rq);
    fe::graph::Tensor_attributes st;
    st.set_name("Stats");
    stats_layout(st);
    auto stats = g->tensor(st);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("mg_sdpa_bwd")
                     .set_attn_scale(k.scale)
                     .set_deterministic_algorithm(k.deterministic);
    if (k.causal) {
      if (bottom_right)
        attrs.set_causal_mask_bottom_right(true);
      else
        attrs.set_causal_mask(true);
    }
    if (k.docs > 0) {
      // The frontend sizes its f32 dQ (and GQA dK/dV) accumulators as max_total_seq_len * the
      // gradient's S stride, laid out like the gradient (its strides and ragged offsets): our
      // offsets and extents stay below S * (B*heads*HD), so S (rounded up to the 64 the frontend's
      // samples use) covers them. Without it the accumulators would be dense [B*D, NH, S, HD].
      const int64_t total = (k.sq + 63) / 64 * 64;
      attrs.set_padding_mask(true)
          .set_seq_len_q(seq_q)
          .set_seq_len_kv(seq_kv)
          .set_max_total_seq_len_q(total)
          .set_max_total_seq_len_kv(total);
    }
    if (k.dropout > 0.0f) attrs.set_dropout(k.dropout, seed, offset);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dO, stats, attrs);
    dq->set_output(true);
    set_layout(*dq, k, kDQ, k.nh, k.sq, rq);
    dk->set_output(true);
    set_layout(*dk, k, kDK, k.ng, k.sk, rkv);
    dv->set_output(true);
    set_layout(*dv, k, kDV, k.ng, k.sk, rkv);
  }
  DeviceGuard guard(k.device);
  fe::error_t st = g->validate();
  if (st.is_good()) st = g->build_operation_graph(handle);
  if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
  if (st.is_good()) st = g->check_support(handle);
  if (st.is_good()) st = g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (st.is_good()) st = g->get_workspace_size(e.workspace);
  if (st.is_bad()) {
    e.why = fe_error(k.backward ? "sdpa backward" : "sdpa forward", st);
    return e;
  }
  e.graph = std::move(g);
  return e;
}

// The graph of `k`: the frontend's choice of forward implementation first; where that fails, the
// composite one (the frontend may pick its unified node, whose support of ragged layouts differs).
Entry build(const Key& k, cudnnHandle_t handle) {
  auto attempt = [&](fe::AttentionImplementation_t impl) {
    try {
      return build_with(k, handle, impl);
    } catch (const std::exception& ex) {  // the frontend throws where no implementation fits
      Entry e;
      e.why = ex.what();
      return e;
    }
  };
  if (k.docs > 0) {
    Entry e;
    e.why = packed_refusal(k);
    if (!e.why.empty()) return e;
  }
  Entry e = attempt(fe::AttentionImplementation_t::AUTO);
  if (e.graph || k.backward) return e;
  Entry composite = attempt(fe::AttentionImplementation_t::COMPOSITE);
  if (composite.graph) return composite;
  e.why += "; with the composite implementation: " + composite.why;
  return e;
}

// The call's key, or false when its arguments are outside what this provider sends to cuDNN.
bool key_of(bool backward, bool deterministic, const Tensor& q, const Tensor& k,
            const AttentionArgs& args, Key* key) {
  if (!q.defined() || !k.defined() || q.shape().size() != 4 || k.shape().size() != 4) return false;
  if (q.device().type != DeviceType::cuda) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  if (args.doc_ids.defined() || args.kv_doc_ids.defined()) return false;
  const float p = args.dropout.p;
  if (!(p >= 0.0f && p < 1.0f)) return false;  // p = 1 (everything dropped) is ours
  Key c{};
  c.device = q.device().index;
  c.backward = backward;
  c.deterministic = backward && deterministic;
  c.causal = args.causal;
  c.dtype = q.dtype();
  c.sq = q.shape()[0];
  c.b = q.shape()[1];
  c.nh = q.shape()[2];
  c.hd = q.shape()[3];
  c.sk = k.shape()[0];
  c.ng = k.shape()[2];
  c.dropout = p;
  if (k.shape()[1] != c.b || k.shape()[3] != c.hd || c.ng <= 0 || c.nh % c.ng != 0) return false;
  if (c.hd % 8 != 0 || c.hd > 256 || c.sq == 0 || c.sk == 0 || c.b == 0) return false;
  if (c.causal && c.sk < c.sq) return false;  // rows that attend nothing: ours (lse = -inf)
  if (args.cu_seqlens.defined()) {
    const Tensor& cu = args.cu_seqlens;
    if (cu.dtype() != DType::i32 || cu.shape().size() != 1 || cu.numel() < 2 || c.sq != c.sk ||
        cu.device() != q.device())
      return false;
    c.docs = cu.numel() - 1;
    // Untested together on a GPU (each is tested alone): ours until a test covers the pair.
    if (p > 0.0f) return false;
  }
  c.scale = args.softmax_scale != 0.0f ? args.softmax_scale
                                       : static_cast<float>(1.0 / std::sqrt(double(c.hd)));
  if (!std::isfinite(c.scale)) return false;
  *key = c;
  return true;
}

bool aligned(const Tensor& t) {
  return (reinterpret_cast<std::uintptr_t>(t.raw_data()) % 16) == 0;
}

// The cached entry of `key` (built on first use); caller holds g_mu.
const Entry& entry(const Key& key, std::string* why) {
  auto it = g_graphs.find(key);
  if (it == g_graphs.end()) {
    std::string no_handle;
    cudnnHandle_t h = handle_of(key.device, &no_handle);
    Entry e;
    if (!h)
      e.why = no_handle;
    else
      e = build(key, h);
    ++(e.graph ? g_stats.graphs : g_stats.unsupported);
    if (!e.graph)  // once per shape: the calls of this shape run our kernels
      std::cerr << "cuda:cudnn: cuDNN does not serve attention " << (key.backward ? "bwd" : "fwd")
                << " " << dtype_name(key.dtype) << " B " << key.b << " NH " << key.nh << " NG "
                << key.ng << " Sq " << key.sq << " Sk " << key.sk << " HD " << key.hd
                << (key.causal ? " causal" : "")
                << (key.dropout > 0.0f ? " dropout " + std::to_string(key.dropout) : "")
                << (key.docs > 0 ? " documents " + std::to_string(key.docs) : "") << ": " << e.why
                << "; our kernels run it" << std::endl;
    it = g_graphs.emplace(key, std::move(e)).first;
  }
  if (!it->second.graph && why) *why = it->second.why;
  return it->second;
}

bool serves(bool backward, bool deterministic, const Tensor& q, const Tensor& k,
            const AttentionArgs& args, std::initializer_list<const Tensor*> all) {
  Key key;
  if (!key_of(backward, deterministic, q, k, args, &key)) return false;
  for (const Tensor* t : all)
    if (!t->defined() || !aligned(*t) || t->device() != q.device()) return false;
  try {
    std::lock_guard lock(g_mu);
    return entry(key, nullptr).graph != nullptr;
  } catch (const std::exception&) {
    return false;
  }
}

// Runs the graph of `key` on the current stream. `pack` holds the op's tensors; this adds what
// the graph reads besides them (dropout seed/offset, the documents' lengths and ragged offsets,
// the padded stats: per-call scratch, stream-ordered) and moves the stats to (forward) or from
// (backward) `lse` [B, NH, Sq] when documents pad them.
void run(const Key& key, const AttentionArgs& args, std::unordered_map<int64_t, void*>& pack,
         float* lse, const char* op) {
  std::lock_guard lock(g_mu);
  std::string why;
  const Entry& e = entry(key, &why);
  MG_CHECK(e.graph, op << " (cuda:cudnn): cuDNN does not serve this call: " << why);
  DeviceGuard guard(key.device);
  cudnnHandle_t h = handle_of(key.device, nullptr);
  cudaStream_t stream = current_stream(key.device);
  MG_CHECK(cudnnSetStream(h, stream) == CUDNN_STATUS_SUCCESS, op << ": cudnnSetStream failed");
  Scratch ws(key.device, static_cast<std::size_t>(e.workspace > 0 ? e.workspace : 1));
  Scratch seed_offset, seq_len, q_off, kv_off, stats;
  if (key.dropout > 0.0f) {
    // Two 16-byte slots: the frontend declares every tensor 16-byte aligned.
    seed_offset = Scratch(key.device, 4 * sizeof(int64_t));
    int64_t* so = seed_offset.as<int64_t>();
    cudnn::write_dropout_seed_offset(so, so + 2, args.dropout.seed, args.dropout.offset, stream);
    pack[kSeed] = so;
    pack[kOffset] = so + 2;
  }
  const auto* cu = key.docs > 0 ? static_cast<const int32_t*>(args.cu_seqlens.raw_data()) : nullptr;
  pack[kStats] = lse;
  if (key.docs > 0) {
    const int64_t nb = key.b * key.docs;
    seq_len = Scratch(key.device, static_cast<std::size_t>(nb) * sizeof(int32_t));
    q_off = Scratch(key.device, static_cast<std::size_t>(nb + 1) * sizeof(int64_t));
    kv_off = Scratch(key.device, static_cast<std::size_t>(nb + 1) * sizeof(int64_t));
    cudnn::build_ragged(cu, key.docs, key.b, key.sq, key.nh * key.hd, key.ng * key.hd,
                        seq_len.as<int32_t>(), q_off.as<int64_t>(), kv_off.as<int64_t>(),
                        key.device, stream);
    stats = Scratch(key.device, static_cast<std::size_t>(nb * key.nh * key.sq) * sizeof(float));
    if (key.backward)
      cudnn::lse_to_stats(lse, stats.as<float>(), cu, key.docs, key.b, key.nh, key.sq, stream);
    pack[kSeqQ] = pack[kSeqKV] = seq_len.get();
    pack[kRaggedQ] = q_off.get();
    pack[kRaggedKV] = kv_off.get();
    pack[kStats] = stats.get();
  }
  detail::count_library_call();
  fe::error_t st = e.graph->execute(h, pack, ws.get());
  MG_CHECK(st.is_good(), op << " (cuda:cudnn): " << st.get_message());
  if (key.docs > 0 && !key.backward)
    cudnn::stats_to_lse(stats.as<float>(), lse, cu, key.docs, key.b, key.nh, key.sq, stream);
  ++(key.backward ? g_stats.bwd_calls : g_stats.fwd_calls);
}

constexpr const char* kServed =
    "needs bf16/f16, head dim a multiple of 8 <= 256, no doc_ids, dropout p < 1, cu_seqlens only "
    "with Sq == Sk and without dropout, causal only with Sk >= Sq";

// The forward; with `rng_dump` ([B, NH, Sq, Sk] f32, dropout only) the test-only graph that also
// writes cuDNN's dropout mask there.
void fwd_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
              const AttentionArgs& args, Tensor* rng_dump) {
  const ops::AttentionDims d = ops::validate_attention_fwd(OnCudaDevice{}, out, lse, q, k, v, args);
  if (q.numel() == 0) return;
  Key key;
  MG_CHECK(key_of(false, false, q, k, args, &key),
           "attention_fwd (cuda:cudnn): not a call cuDNN serves here ("
               << kServed << "); got " << dtype_name(q.dtype()) << ", head dim " << d.hd);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()}, {kK, k.raw_data()}, {kV, v.raw_data()}, {kO, out.raw_data()}};
  if (rng_dump) {
    key.rng_dump = true;
    pack[kRngDump] = rng_dump->raw_data();
  }
  run(key, args, pack, static_cast<float*>(lse.raw_data()), "attention_fwd");
}
void cudnn_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionArgs& args) {
  fwd_impl(out, lse, q, k, v, args, nullptr);
}

void bwd(bool deterministic, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
         const AttentionArgs& args) {
  const ops::AttentionDims d =
      ops::validate_attention_bwd(OnCudaDevice{}, dq, dk, dv, dout, q, k, v, out, lse, args);
  if (q.numel() == 0) return;
  Key key;
  MG_CHECK(key_of(true, deterministic, q, k, args, &key),
           "attention_bwd (cuda:cudnn): not a call cuDNN serves here ("
               << kServed << "); got " << dtype_name(q.dtype()) << ", head dim " << d.hd);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()},     {kK, k.raw_data()},   {kV, v.raw_data()},   {kO, out.raw_data()},
      {kDO, dout.raw_data()}, {kDQ, dq.raw_data()}, {kDK, dk.raw_data()}, {kDV, dv.raw_data()}};
  run(key, args, pack, static_cast<float*>(lse.raw_data()), "attention_bwd");
}
void cudnn_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
               const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
               const AttentionArgs& args) {
  bwd(false, dq, dk, dv, dout, q, k, v, out, lse, args);
}
void cudnn_bwd_deterministic(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const AttentionArgs& args) {
  bwd(true, dq, dk, dv, dout, q, k, v, out, lse, args);
}

bool fwd_supports(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionArgs& args) {
  if (!lse.defined() || lse.dtype() != DType::f32 || !v.defined() || v.dtype() != q.dtype() ||
      k.dtype() != q.dtype() || out.dtype() != q.dtype())
    return false;
  return serves(false, false, q, k, args, {&out, &lse, &q, &k, &v});
}
bool bwd_supports_impl(bool det, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const AttentionArgs& args) {
  if (!lse.defined() || lse.dtype() != DType::f32) return false;
  for (const Tensor* t : {static_cast<const Tensor*>(&dq), static_cast<const Tensor*>(&dk),
                          static_cast<const Tensor*>(&dv), &dout, &k, &v, &out})
    if (!t->defined() || t->dtype() != q.dtype()) return false;
  return serves(true, det, q, k, args, {&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse});
}
bool bwd_supports(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                  const AttentionArgs& args) {
  return bwd_supports_impl(false, dq, dk, dv, dout, q, k, v, out, lse, args);
}
bool bwd_det_supports(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                      const AttentionArgs& args) {
  return bwd_supports_impl(true, dq, dk, dv, dout, q, k, v, out, lse, args);
}

}  // namespace

namespace cudnn {
std::mutex& handle_mutex() {
  return g_mu;
}
cudnnHandle_t device_handle(int device, std::string* why) {
  return handle_of(device, why);
}
}  // namespace cudnn

std::string cudnn_attention_version() {
  std::ostringstream os;
  const size_t v = cudnnGetVersion();
  os << "cuDNN " << v / 10000 << "." << (v % 10000) / 100 << "." << v % 100 << " (built with "
     << CUDNN_MAJOR << "." << CUDNN_MINOR << "." << CUDNN_PATCHLEVEL << "), cudnn-frontend "
     << CUDNN_FRONTEND_MAJOR_VERSION << "." << CUDNN_FRONTEND_MINOR_VERSION << "."
     << CUDNN_FRONTEND_PATCH_VERSION;
  return os.str();
}

CudnnAttentionStats cudnn_attention_stats() {
  std::lock_guard lock(g_mu);
  return g_stats;
}

void register_cudnn_attention_kernels(plugin::Registry& r) {
  r.register_op<OpId::attention_fwd>(kPlatformName, &cudnn_fwd, "cuda:cudnn", Priority::alternative,
                                     {.supports = &fwd_supports});
  r.register_op<OpId::attention_bwd>(kPlatformName, &cudnn_bwd, "cuda:cudnn", Priority::alternative,
                                     {.supports = &bwd_supports, .deterministic = false});
  r.register_op<OpId::attention_bwd>(kPlatformName, &cudnn_bwd_deterministic,
                                     "cuda:cudnn-deterministic", Priority::alternative,
                                     {.supports = &bwd_det_supports});
  cudnn::register_cudnn_fp8_attention_kernels(r);
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::CudnnAttentionStats mg_cuda_cudnn_attention_stats() {
  return mg::platforms::cuda::cudnn_attention_stats();
}
// Test-only: the forward of cuda:cudnn on a graph that also writes cuDNN's dropout mask to
// rng_dump ([B, NH, Sq, Sk] f32 on q's device: 1 kept, 0 dropped, as the frontend's own tests read
// it), for args with dropout and without documents. Returns null on success, else why not (cuDNN
// refused the graph, e.g. no RNG dump on this architecture; the string lives until the next call
// on this thread).
extern "C" const char* mg_cuda_cudnn_attention_fwd_rng_dump(
    mg::Tensor& out, mg::Tensor& lse, mg::Tensor& rng_dump, const mg::Tensor& q,
    const mg::Tensor& k, const mg::Tensor& v, const mg::ops::AttentionArgs& args) {
  thread_local std::string why;
  try {
    MG_CHECK(args.dropout.p > 0.0f && !args.cu_seqlens.defined(),
             "the RNG dump needs dropout and no cu_seqlens");
    MG_CHECK(
        rng_dump.dtype() == mg::DType::f32 && rng_dump.device() == q.device() &&
            rng_dump.shape() == mg::Shape({q.shape()[1], q.shape()[2], q.shape()[0], k.shape()[0]}),
        "rng_dump must be [B, NH, Sq, Sk] f32 on q's device, got " << rng_dump.str());
    mg::platforms::cuda::fwd_impl(out, lse, q, k, v, args, &rng_dump);
    return nullptr;
  } catch (const std::exception& e) {
    why = e.what();
    return why.c_str();
  }
}
extern "C" const char* mg_cuda_cudnn_attention_version() {
  static const std::string v = mg::platforms::cuda::cudnn_attention_version();
  return v.c_str();
}
