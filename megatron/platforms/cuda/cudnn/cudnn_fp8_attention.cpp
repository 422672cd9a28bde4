// cuDNN FP8 dot-product attention (docs/fp8.md "FP8 attention"; Transformer Engine's fp8_dpa, its
// FusedAttention sub-backend 2): the provider "cuda:cudnn" of fp8_attention_fwd and
// fp8_attention_bwd, the CUDA platform's only one (Priority::platform, no supports predicate: a
// call it cannot run throws, saying what FP8 attention needs and why this call is refused). Built
// with the bf16 provider (cudnn_attention.cpp, MG_WITH_CUDNN), whose per-device cuDNN handles and
// lock it shares (cudnn_shared.h); register_cudnn_attention_kernels registers it.
//
// Graphs: the cuDNN frontend's sdpa_fp8 (the composite node of
// node/scaled_dot_product_flash_attention.h with FP8 bmm2) and sdpa_fp8_backward
// (node/sdpa_fp8_bwd.h), IO data type the q/k/v format, intermediate and compute f32: the logical
// graph platforms/cpu/fp8_attention.cpp computes (its comment states it; cuDNN runs it as one flash
// kernel, so its results lie within cuda_fp8_attention_test's derived bound, not bit for bit).
// Layout: q, k, v, out, dout, dq, dk, dv are sbhd [S, B, heads, HD], given to cuDNN as (B, heads,
// S, HD) with strides (heads HD, HD, B heads HD, 1), as the bf16 provider does; out has q's
// format, dout, dq, dk, dv the gradient's (E5M2 under the hybrid recipe); lse [B, NH, S] f32 is
// cuDNN's Stats (the natural log-sum-exp of the scaled scores), which the backward reads back.
// Scales: device pointers to the elements of the op's f32[3] vectors (declared 4-byte aligned;
// where cuDNN refuses that, the graph is rebuilt with 16-byte scalars and each call stages them
// through a scratch of 16-byte slots), so the recipe's scales never leave the device: descale_q =
// descale_k = descale_v = fwd_scale_inv[0], scale_s = fwd_scale[1], descale_s = fwd_scale_inv[1],
// scale_o = fwd_scale[2], descale_o = fwd_scale_inv[2]; descale_dO = bwd_scale_inv[0], scale_dP =
// bwd_scale[1], descale_dP = bwd_scale_inv[1], scale_dQ = scale_dK = scale_dV = bwd_scale[2] (each
// its own graph tensor; several share an address, as Transformer Engine's slices of its scale
// vectors do). cuDNN writes the amaxes (before their scaling) into the elements of `amax`: forward
// (Amax_S, Amax_O), backward (Amax_dP, Amax_dQ, Amax_dK, Amax_dV); Amax_dP is the max |dS| of the
// scaled-softmax gradient that scale_dP casts.
//
// Served (the op's contract, validate_fp8_attention_*: self-attention Sq == Sk, no dropout, no
// document masks): causal (top-left, which is bottom-right when Sq == Sk; cuDNN's bottom-right FP8
// mask is Blackwell-only) or not, GQA / MQA (K/V with NG heads; the backward's dK, dV sum a group's
// heads), softmax_scale (0: 1/sqrt(HD)). Needs a GPU of compute capability >= 9.0, cuDNN >= 9.1
// but not 9.10.0, a head dim that is a multiple of 16 and <= 256 (checked here, with a message
// naming them), 16-byte-aligned q, k, v, out, lse, dout, dq, dk, dv; the rest is the frontend's and
// cuDNN's own check_support for this GPU and library, whose refusal text the error carries (e.g.
// frontend 1.16: the backward on Hopper takes head dim 128 only, Blackwell head dims <= 128; an
// FP8 O is required on Hopper, bf16 O being Blackwell-only). A refused key is cached as such.
//
// Graphs are built once per (device, direction, causal, formats, B, NH, NG, S, HD, softmax scale)
// and cached with their workspace size; a call binds the device's handle to the thread's current
// stream and executes under the shared lock; the workspace comes from the caching allocator
// (stream-ordered). Determinism: the backward is registered non-deterministic (Transformer Engine
// lists FusedAttention sub-backend 2 as non-deterministic, and the frontend's FP8 backward has no
// deterministic-algorithm option), so a --deterministic-mode run resolves no fp8_attention_bwd on
// CUDA; the forward is deterministic. Counters: cudnn_fp8_attention_stats() (C symbol
// mg_cuda_cudnn_fp8_attention_stats). Outputs are written (=), as every attention op here.
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cudnn/cudnn_shared.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda::cudnn {
namespace {

namespace fe = cudnn_frontend;
using ops::AttentionArgs;
using ops::OpId;
using plugin::Priority;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

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
  kDescaleQ,
  kDescaleK,
  kDescaleV,
  kDescaleS,
  kDescaleO,
  kDescaleDO,
  kDescaleDP,
  kScaleS,
  kScaleO,
  kScaleDQ,
  kScaleDK,
  kScaleDV,
  kScaleDP,
  kAmaxS,
  kAmaxO,
  kAmaxDP,
  kAmaxDQ,
  kAmaxDK,
  kAmaxDV,
};

struct Key {
  int device;
  bool backward, causal;
  // The scale and amax scalars: false = the op's vector elements as they are, declared 4-byte
  // aligned; true = staged through 16-byte slots of a scratch (the frontend's default alignment),
  // the fallback where cuDNN refuses the 4-byte declaration.
  bool staged;
  DType qkv, grad;  // grad: dout's format (backward; the forward repeats qkv)
  int64_t b, nh, ng, s, hd;
  float scale;
  auto tie() const {
    return std::tie(device, backward, causal, staged, qkv, grad, b, nh, ng, s, hd, scale);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: refused, `why` says why
  int64_t workspace = 0;
  std::string why;
};

std::map<Key, Entry> g_graphs;   // guarded by handle_mutex()
CudnnFp8AttentionStats g_stats;  // guarded by handle_mutex()

constexpr const char* kNeeds =
    "cuDNN FP8 attention needs a GPU of compute capability >= 9.0 (sm_90+), cuDNN >= 9.1 (not "
    "9.10.0), a head dim that is a multiple of 16 and <= 256, and a shape cuDNN accepts on this "
    "GPU (cuDNN frontend 1.16: the backward on Hopper only head dim 128, Blackwell head dim <= "
    "128; NVTE_FP8_DPA_BWD=0 keeps the FP8 forward and runs the backward in the model dtype)";

fe::DataType_t fe_fp8(DType t) {
  return t == DType::fp8_e5m2 ? fe::DataType_t::FP8_E5M2 : fe::DataType_t::FP8_E4M3;
}

std::string version_string(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

// The (B, heads, S, HD) view of an sbhd tensor [S, B, heads, HD].
void set_layout(fe::graph::Tensor_attributes& t, const Key& k, int64_t uid, int64_t heads,
                DType dtype) {
  t.set_uid(uid)
      .set_data_type(fe_fp8(dtype))
      .set_dim({k.b, heads, k.s, k.hd})
      .set_stride({heads * k.hd, k.hd, k.b * heads * k.hd, 1});
}
TensorAttr input(fe::graph::Graph& g, const char* name, const Key& k, int64_t uid, int64_t heads,
                 DType dtype) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  set_layout(t, k, uid, heads, dtype);
  return g.tensor(t);
}
// A device f32 scalar (a scale, or an amax output once marked so): an element of the op's f32[3]
// or f32[4] vectors (4-byte aligned), or a 16-byte slot when staged.
void scalar_layout(fe::graph::Tensor_attributes& t, int64_t uid, bool staged) {
  t.set_uid(uid)
      .set_dim({1, 1, 1, 1})
      .set_stride({1, 1, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT)
      .set_alignment(staged ? 16 : 4);
}
TensorAttr scalar(fe::graph::Graph& g, const char* name, int64_t uid, bool staged) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  scalar_layout(t, uid, staged);
  return g.tensor(t);
}
void amax_output(const TensorAttr& t, int64_t uid, bool staged) {
  t->set_output(true);
  scalar_layout(*t, uid, staged);
}
void stats_layout(fe::graph::Tensor_attributes& t, const Key& k) {
  t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({k.b, k.nh, k.s, 1})
      .set_stride({k.nh * k.s, k.s, 1, 1});
}

// Why this device / library / head dim cannot run FP8 attention at all, or "".
std::string refusal(const Key& k) {
  const cudaDeviceProp& p = device_properties(k.device);
  if (p.major < 9)
    return "device " + std::to_string(k.device) + " (" + p.name + ") has compute capability " +
           std::to_string(p.major) + "." + std::to_string(p.minor) + ", below 9.0";
  const std::size_t v = cudnnGetVersion();
  if (v < 90100 || v == 91000) return "this is cuDNN " + version_string(v);
  if (k.hd % 16 != 0 || k.hd > 256)
    return "head dim " + std::to_string(k.hd) + " is not a multiple of 16 <= 256";
  return "";
}

// Builds the graph of `k` (caller holds handle_mutex()); an Entry without a graph says why not.
Entry build_graph(const Key& k, cudnnHandle_t handle) {
  Entry e;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_fp8(k.qkv))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = input(*g, "Q", k, kQ, k.nh, k.qkv);
  auto kk = input(*g, "K", k, kK, k.ng, k.qkv);
  auto v = input(*g, "V", k, kV, k.ng, k.qkv);
  auto descale_q = scalar(*g, "descale_q", kDescaleQ, k.staged);
  auto descale_k = scalar(*g, "descale_k", kDescaleK, k.staged);
  auto descale_v = scalar(*g, "descale_v", kDescaleV, k.staged);
  auto descale_s = scalar(*g, "descale_s", kDescaleS, k.staged);
  auto scale_s = scalar(*g, "scale_s", kScaleS, k.staged);
  if (!k.backward) {
    auto scale_o = scalar(*g, "scale_o", kScaleO, k.staged);
    auto attrs = fe::graph::SDPA_fp8_attributes()
                     .set_name("mg_sdpa_fp8_fwd")
                     .set_generate_stats(true)
                     .set_attn_scale(k.scale);
    if (k.causal) attrs.set_causal_mask(true);
    auto [o, stats, amax_s, amax_o] =
        g->sdpa_fp8(q, kk, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, attrs);
    o->set_output(true);
    set_layout(*o, k, kO, k.nh, k.qkv);
    stats->set_output(true);
    stats_layout(*stats, k);
    amax_output(amax_s, kAmaxS, k.staged);
    amax_output(amax_o, kAmaxO, k.staged);
  } else {
    auto o = input(*g, "O", k, kO, k.nh, k.qkv);
    auto dO = input(*g, "dO", k, kDO, k.nh, k.grad);
    fe::graph::Tensor_attributes st;
    st.set_name("Stats");
    stats_layout(st, k);
    auto stats = g->tensor(st);
    auto descale_o = scalar(*g, "descale_o", kDescaleO, k.staged);
    auto descale_dO = scalar(*g, "descale_dO", kDescaleDO, k.staged);
    auto descale_dP = scalar(*g, "descale_dP", kDescaleDP, k.staged);
    auto scale_dQ = scalar(*g, "scale_dQ", kScaleDQ, k.staged);
    auto scale_dK = scalar(*g, "scale_dK", kScaleDK, k.staged);
    auto scale_dV = scalar(*g, "scale_dV", kScaleDV, k.staged);
    auto scale_dP = scalar(*g, "scale_dP", kScaleDP, k.staged);
    auto attrs = fe::graph::SDPA_fp8_backward_attributes()
                     .set_name("mg_sdpa_fp8_bwd")
                     .set_attn_scale(k.scale);
    if (k.causal) attrs.set_causal_mask(true);
    auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = g->sdpa_fp8_backward(
        q, kk, v, o, dO, stats, descale_q, descale_k, descale_v, descale_o, descale_dO, descale_s,
        descale_dP, scale_s, scale_dQ, scale_dK, scale_dV, scale_dP, attrs);
    dq->set_output(true);
    set_layout(*dq, k, kDQ, k.nh, k.grad);
    dk->set_output(true);
    set_layout(*dk, k, kDK, k.ng, k.grad);
    dv->set_output(true);
    set_layout(*dv, k, kDV, k.ng, k.grad);
    amax_output(amax_dp, kAmaxDP, k.staged);
    amax_output(amax_dq, kAmaxDQ, k.staged);
    amax_output(amax_dk, kAmaxDK, k.staged);
    amax_output(amax_dv, kAmaxDV, k.staged);
  }
  DeviceGuard guard(k.device);
  fe::error_t st = g->validate();
  if (st.is_good()) st = g->build_operation_graph(handle);
  if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
  if (st.is_good()) st = g->check_support(handle);
  if (st.is_good()) st = g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (st.is_good()) st = g->get_workspace_size(e.workspace);
  if (st.is_bad()) {
    e.why = std::string(k.backward ? "sdpa_fp8_backward" : "sdpa_fp8") + ": " + st.get_message();
    return e;
  }
  e.graph = std::move(g);
  return e;
}

// The cached entry of `key`, built on first use (caller holds handle_mutex()).
const Entry& entry(const Key& key) {
  auto it = g_graphs.find(key);
  if (it != g_graphs.end()) return it->second;
  Entry e;
  e.why = refusal(key);
  if (e.why.empty()) {
    std::string no_handle;
    if (cudnnHandle_t h = device_handle(key.device, &no_handle)) {
      try {
        e = build_graph(key, h);
      } catch (const std::exception& ex) {  // the frontend throws where no implementation fits
        e = Entry{};
        e.why = ex.what();
      }
    } else {
      e.why = no_handle;
    }
  }
  ++(e.graph ? g_stats.graphs : g_stats.unsupported);
  return g_graphs.emplace(key, std::move(e)).first->second;
}

std::string shape_of(const Key& k) {
  return std::string(dtype_name(k.qkv)) +
         (k.backward ? " (gradients " + std::string(dtype_name(k.grad)) + ")" : "") + " B " +
         std::to_string(k.b) + " NH " + std::to_string(k.nh) + " NG " + std::to_string(k.ng) +
         " S " + std::to_string(k.s) + " HD " + std::to_string(k.hd) + (k.causal ? " causal" : "");
}

bool is_scalar(int64_t uid) {
  return uid >= kDescaleQ;
}
bool is_amax(int64_t uid) {
  return uid >= kAmaxS;
}

// Runs the graph of `key` on the current stream with the device pointers of `pack`: the graph
// with 4-byte-aligned scalars where cuDNN takes it, else the staged one (the scales copied into
// 16-byte slots before, the amaxes copied out after; counted in stats.staged_calls).
void execute(Key key, std::unordered_map<int64_t, void*>& pack, const char* op) {
  std::lock_guard lock(handle_mutex());
  key.staged = false;
  const Entry* e = &entry(key);
  if (!e->graph && refusal(key).empty()) {
    Key staged = key;
    staged.staged = true;
    const Entry& s = entry(staged);
    MG_CHECK(s.graph, op << " (cuda:cudnn): cuDNN cannot run " << shape_of(key) << ": " << e->why
                         << " (with 16-byte staged scalars: " << s.why << "). " << kNeeds);
    key = staged;
    e = &s;
  }
  MG_CHECK(e->graph, op << " (cuda:cudnn): cuDNN cannot run " << shape_of(key) << ": " << e->why
                        << ". " << kNeeds);
  DeviceGuard guard(key.device);
  cudnnHandle_t h = device_handle(key.device, nullptr);
  cudaStream_t stream = current_stream(key.device);
  MG_CHECK(cudnnSetStream(h, stream) == CUDNN_STATUS_SUCCESS, op << ": cudnnSetStream failed");
  Scratch ws(key.device, static_cast<std::size_t>(e->workspace > 0 ? e->workspace : 1));
  Scratch slots;
  std::vector<std::pair<int64_t, void*>> amax_out;  // staged: uid, the op's element
  if (key.staged) {
    slots = Scratch(key.device, 16 * pack.size());
    std::size_t i = 0;
    for (auto& [uid, ptr] : pack) {
      if (!is_scalar(uid)) continue;
      void* slot = slots.as<char>() + 16 * i++;
      if (is_amax(uid))
        amax_out.emplace_back(uid, ptr);
      else
        MG_CUDA_CHECK(cudaMemcpyAsync(slot, ptr, sizeof(float), cudaMemcpyDeviceToDevice, stream));
      ptr = slot;
    }
  }
  detail::count_library_call();
  fe::error_t st = e->graph->execute(h, pack, ws.get());
  MG_CHECK(st.is_good(), op << " (cuda:cudnn): " << shape_of(key) << ": " << st.get_message());
  for (const auto& [uid, dst] : amax_out)
    MG_CUDA_CHECK(
        cudaMemcpyAsync(dst, pack.at(uid), sizeof(float), cudaMemcpyDeviceToDevice, stream));
  ++(key.backward ? g_stats.bwd_calls : g_stats.fwd_calls);
  if (key.staged) ++g_stats.staged_calls;
}

Key key_of(bool backward, const Tensor& q, const Tensor& k, DType grad, const ops::AttentionDims& d,
           const AttentionArgs& args) {
  Key c{};
  c.device = q.device().index;
  c.backward = backward;
  c.causal = args.causal;
  c.qkv = q.dtype();
  c.grad = grad;
  c.b = d.b;
  c.nh = d.nh;
  c.ng = k.size(2);
  c.s = d.s;
  c.hd = d.hd;
  c.scale = args.softmax_scale != 0.0f ? args.softmax_scale
                                       : static_cast<float>(1.0 / std::sqrt(double(d.hd)));
  return c;
}

// cuDNN's tensors are declared 16-byte aligned (the frontend's default).
void check_aligned(const char* op,
                   std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, t] : tensors)
    MG_CHECK(reinterpret_cast<std::uintptr_t>(t->raw_data()) % 16 == 0,
             op << " (cuda:cudnn): " << name << " " << t->str()
                << " is not 16-byte aligned (cuDNN's tensors must be; byte offset "
                << t->offset_bytes() << ")");
}

float* f32_at(const Tensor& t, int64_t i) {
  return static_cast<float*>(t.raw_data()) + i;
}

// Empty tensors: nothing for cuDNN to run; the amaxes are written (0), as the op promises.
void zero_amax(Tensor& amax) {
  const int dev = amax.device().index;
  DeviceGuard guard(dev);
  MG_CUDA_CHECK(cudaMemsetAsync(amax.raw_data(), 0, amax.nbytes(), current_stream(dev)));
}

void fp8_attention_fwd(Tensor& out, Tensor& lse, Tensor& amax, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                       const AttentionArgs& args) {
  const char* op = "fp8_attention_fwd";
  const ops::AttentionDims d = ops::validate_fp8_attention_fwd(OnCudaDevice{}, out, lse, amax, q, k,
                                                               v, fwd_scale, fwd_scale_inv, args);
  if (q.numel() == 0) return zero_amax(amax);
  check_aligned(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});
  const Key key = key_of(false, q, k, q.dtype(), d, args);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()},
      {kK, k.raw_data()},
      {kV, v.raw_data()},
      {kO, out.raw_data()},
      {kStats, lse.raw_data()},
      {kDescaleQ, f32_at(fwd_scale_inv, 0)},
      {kDescaleK, f32_at(fwd_scale_inv, 0)},
      {kDescaleV, f32_at(fwd_scale_inv, 0)},
      {kScaleS, f32_at(fwd_scale, 1)},
      {kDescaleS, f32_at(fwd_scale_inv, 1)},
      {kScaleO, f32_at(fwd_scale, 2)},
      {kAmaxS, f32_at(amax, 0)},
      {kAmaxO, f32_at(amax, 1)},
  };
  execute(key, pack, op);
}

void fp8_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& amax, const Tensor& dout,
                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                       const Tensor& bwd_scale, const Tensor& bwd_scale_inv,
                       const AttentionArgs& args) {
  const char* op = "fp8_attention_bwd";
  const ops::AttentionDims d =
      ops::validate_fp8_attention_bwd(OnCudaDevice{}, dq, dk, dv, amax, dout, q, k, v, out, lse,
                                      fwd_scale, fwd_scale_inv, bwd_scale, bwd_scale_inv, args);
  if (q.numel() == 0) return zero_amax(amax);
  check_aligned(op, {{"q", &q},
                     {"k", &k},
                     {"v", &v},
                     {"out", &out},
                     {"lse", &lse},
                     {"dout", &dout},
                     {"dq", &dq},
                     {"dk", &dk},
                     {"dv", &dv}});
  const Key key = key_of(true, q, k, dout.dtype(), d, args);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()},
      {kK, k.raw_data()},
      {kV, v.raw_data()},
      {kO, out.raw_data()},
      {kDO, dout.raw_data()},
      {kStats, lse.raw_data()},
      {kDQ, dq.raw_data()},
      {kDK, dk.raw_data()},
      {kDV, dv.raw_data()},
      {kDescaleQ, f32_at(fwd_scale_inv, 0)},
      {kDescaleK, f32_at(fwd_scale_inv, 0)},
      {kDescaleV, f32_at(fwd_scale_inv, 0)},
      {kScaleS, f32_at(fwd_scale, 1)},
      {kDescaleS, f32_at(fwd_scale_inv, 1)},
      {kDescaleO, f32_at(fwd_scale_inv, 2)},
      {kDescaleDO, f32_at(bwd_scale_inv, 0)},
      {kScaleDP, f32_at(bwd_scale, 1)},
      {kDescaleDP, f32_at(bwd_scale_inv, 1)},
      {kScaleDQ, f32_at(bwd_scale, 2)},
      {kScaleDK, f32_at(bwd_scale, 2)},
      {kScaleDV, f32_at(bwd_scale, 2)},
      {kAmaxDP, f32_at(amax, 0)},
      {kAmaxDQ, f32_at(amax, 1)},
      {kAmaxDK, f32_at(amax, 2)},
      {kAmaxDV, f32_at(amax, 3)},
  };
  execute(key, pack, op);
}

}  // namespace

CudnnFp8AttentionStats cudnn_fp8_attention_stats() {
  std::lock_guard lock(handle_mutex());
  return g_stats;
}

void register_cudnn_fp8_attention_kernels(plugin::Registry& r) {
  r.register_op<OpId::fp8_attention_fwd>(kPlatformName, &fp8_attention_fwd, "cuda:cudnn");
  r.register_op<OpId::fp8_attention_bwd>(kPlatformName, &fp8_attention_bwd, "cuda:cudnn",
                                         Priority::platform, {.deterministic = false});
}

}  // namespace mg::platforms::cuda::cudnn

extern "C" mg::platforms::cuda::cudnn::CudnnFp8AttentionStats mg_cuda_cudnn_fp8_attention_stats() {
  return mg::platforms::cuda::cudnn::cudnn_fp8_attention_stats();
}
