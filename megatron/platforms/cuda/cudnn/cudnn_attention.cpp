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
// leave rows that attend nothing and is ours), no dropout, no document masks (doc_ids, kv_doc_ids,
// cu_seqlens), 16-byte-aligned pointers. The layout is Megatron's sbhd ([S, B, heads, HD]), given
// to cuDNN as strides of a (B, heads, S, HD) tensor; lse [B, NH, Sq] f32 is cuDNN's Stats
// (log-sum-exp of the scaled scores, natural log), which the backward reads back and context
// parallelism merges. Gradients are written (=), as every attention backward here.
//
// Graphs are built once per (device, shape, dtype, mask, scale, deterministic) and cached with
// their workspace size; a shape cuDNN rejects is cached as unsupported, so the predicate (asked
// before every call) costs one map lookup after the first call, and says once on stderr why. One
// cuDNN handle per device, bound to the thread's current stream at each call; the workspace comes
// from the caching device allocator (stream-ordered). The deterministic backward asks cuDNN for its
// deterministic algorithm (no atomics in dQ); "cuda:cudnn" (not deterministic) is dropped by the
// registry in a deterministic run.
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
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {
namespace {

namespace fe = cudnn_frontend;
using ops::AttentionArgs;
using ops::OpId;
using plugin::Priority;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  int device;
  bool backward, deterministic, causal;
  DType dtype;
  int64_t b, nh, ng, sq, sk, hd;
  float scale;
  auto tie() const {
    return std::tie(device, backward, deterministic, causal, dtype, b, nh, ng, sq, sk, hd, scale);
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

// A (B, heads, S, HD) view of an sbhd tensor [S, B, heads, HD].
std::shared_ptr<fe::graph::Tensor_attributes> sbhd(fe::graph::Graph& g, const char* name,
                                                   int64_t uid, int64_t b, int64_t h, int64_t s,
                                                   int64_t hd) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, h, s, hd})
                      .set_stride({h * hd, hd, b * h * hd, 1}));
}
void set_sbhd(fe::graph::Tensor_attributes& t, int64_t uid, int64_t b, int64_t h, int64_t s,
              int64_t hd) {
  t.set_uid(uid).set_dim({b, h, s, hd}).set_stride({h * hd, hd, b * h * hd, 1});
}

std::string fe_error(const char* what, fe::error_t e) {
  return std::string(what) + ": " + e.get_message();
}

// Builds the graph of `k` (caller holds g_mu); an Entry without a graph says why not.
Entry build(const Key& k, cudnnHandle_t handle) {
  Entry e;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = sbhd(*g, "Q", kQ, k.b, k.nh, k.sq, k.hd);
  auto kk = sbhd(*g, "K", kK, k.b, k.ng, k.sk, k.hd);
  auto v = sbhd(*g, "V", kV, k.b, k.ng, k.sk, k.hd);
  if (!k.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("mg_sdpa_fwd")
                     .set_generate_stats(true)
                     .set_attn_scale(k.scale);
    if (k.causal) {
      if (k.sq == k.sk)
        attrs.set_causal_mask(true);
      else
        attrs.set_causal_mask_bottom_right(true);
    }
    auto [o, stats] = g->sdpa(q, kk, v, attrs);
    o->set_output(true);
    set_sbhd(*o, kO, k.b, k.nh, k.sq, k.hd);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({k.b, k.nh, k.sq, 1})
        .set_stride({k.nh * k.sq, k.sq, 1, 1});
  } else {
    auto o = sbhd(*g, "O", kO, k.b, k.nh, k.sq, k.hd);
    auto dO = sbhd(*g, "dO", kDO, k.b, k.nh, k.sq, k.hd);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim({k.b, k.nh, k.sq, 1})
                               .set_stride({k.nh * k.sq, k.sq, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("mg_sdpa_bwd")
                     .set_attn_scale(k.scale)
                     .set_deterministic_algorithm(k.deterministic);
    if (k.causal) {
      if (k.sq == k.sk)
        attrs.set_causal_mask(true);
      else
        attrs.set_causal_mask_bottom_right(true);
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dO, stats, attrs);
    dq->set_output(true);
    set_sbhd(*dq, kDQ, k.b, k.nh, k.sq, k.hd);
    dk->set_output(true);
    set_sbhd(*dk, kDK, k.b, k.ng, k.sk, k.hd);
    dv->set_output(true);
    set_sbhd(*dv, kDV, k.b, k.ng, k.sk, k.hd);
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

// The call's key, or false when its arguments are outside what this provider sends to cuDNN.
bool key_of(bool backward, bool deterministic, const Tensor& q, const Tensor& k,
            const AttentionArgs& args, Key* key) {
  if (!q.defined() || !k.defined() || q.shape().size() != 4 || k.shape().size() != 4) return false;
  if (q.device().type != DeviceType::cuda) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  if (args.dropout.p != 0.0f || args.doc_ids.defined() || args.kv_doc_ids.defined() ||
      args.cu_seqlens.defined())
    return false;
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
  if (k.shape()[1] != c.b || k.shape()[3] != c.hd || c.ng <= 0 || c.nh % c.ng != 0) return false;
  if (c.hd % 8 != 0 || c.hd > 256 || c.sq == 0 || c.sk == 0 || c.b == 0) return false;
  if (c.causal && c.sk < c.sq) return false;  // rows that attend nothing: ours (lse = -inf)
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
                << (key.causal ? " causal" : "") << ": " << e.why << "; our kernels run it"
                << std::endl;
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

void run(const Key& key, std::unordered_map<int64_t, void*>& pack, const char* op) {
  std::lock_guard lock(g_mu);
  std::string why;
  const Entry& e = entry(key, &why);
  MG_CHECK(e.graph, op << " (cuda:cudnn): cuDNN does not serve this call: " << why);
  DeviceGuard guard(key.device);
  cudnnHandle_t h = handle_of(key.device, nullptr);
  cudaStream_t stream = current_stream(key.device);
  MG_CHECK(cudnnSetStream(h, stream) == CUDNN_STATUS_SUCCESS, op << ": cudnnSetStream failed");
  Scratch ws(key.device, static_cast<std::size_t>(e.workspace > 0 ? e.workspace : 1));
  detail::count_library_call();
  fe::error_t st = e.graph->execute(h, pack, ws.get());
  MG_CHECK(st.is_good(), op << " (cuda:cudnn): " << st.get_message());
  ++(key.backward ? g_stats.bwd_calls : g_stats.fwd_calls);
}

void cudnn_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionArgs& args) {
  const ops::AttentionDims d = ops::validate_attention_fwd(OnCudaDevice{}, out, lse, q, k, v, args);
  if (q.numel() == 0) return;
  Key key;
  MG_CHECK(key_of(false, false, q, k, args, &key),
           "attention_fwd (cuda:cudnn): not a call cuDNN serves here (needs bf16/f16, head dim a "
           "multiple of 8 <= 256, no dropout or document masks, causal only with Sk >= Sq); got "
               << dtype_name(q.dtype()) << ", head dim " << d.hd);
  std::unordered_map<int64_t, void*> pack = {{kQ, q.raw_data()},
                                             {kK, k.raw_data()},
                                             {kV, v.raw_data()},
                                             {kO, out.raw_data()},
                                             {kStats, lse.raw_data()}};
  run(key, pack, "attention_fwd");
}

void bwd(bool deterministic, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
         const AttentionArgs& args) {
  const ops::AttentionDims d =
      ops::validate_attention_bwd(OnCudaDevice{}, dq, dk, dv, dout, q, k, v, out, lse, args);
  if (q.numel() == 0) return;
  Key key;
  MG_CHECK(key_of(true, deterministic, q, k, args, &key),
           "attention_bwd (cuda:cudnn): not a call cuDNN serves here (needs bf16/f16, head dim a "
           "multiple of 8 <= 256, no dropout or document masks, causal only with Sk >= Sq); got "
               << dtype_name(q.dtype()) << ", head dim " << d.hd);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()},   {kK, k.raw_data()},     {kV, v.raw_data()},
      {kO, out.raw_data()}, {kDO, dout.raw_data()}, {kStats, lse.raw_data()},
      {kDQ, dq.raw_data()}, {kDK, dk.raw_data()},   {kDV, dv.raw_data()}};
  run(key, pack, "attention_bwd");
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
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::CudnnAttentionStats mg_cuda_cudnn_attention_stats() {
  return mg::platforms::cuda::cudnn_attention_stats();
}
extern "C" const char* mg_cuda_cudnn_attention_version() {
  static const std::string v = mg::platforms::cuda::cudnn_attention_version();
  return v.c_str();
}
