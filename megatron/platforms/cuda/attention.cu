// CUDA scaled dot-product attention (forward and backward) on Megatron's sbhd layout, with GQA,
// causal and document masks (doc_ids or cu_seqlens) and counter-based attention dropout.
//
// Gradient rule: no parameters; dq, dk, dv are activation gradients and are written (=).
// Invariants (the contract of op_args.h, shared with megatron/platforms/cpu/attention.cpp):
//   - q, out, dq, dout [S, B, NH, HD]; k, v, dk, dv [S, B, NG, HD]; lse [B, NH, S] f32 (f64 for
//     f64). Head h reads KV group h / (NH / NG); dk/dv sum over the heads of a group.
//   - Scores and softmax in f32 for f32/bf16/f16 storage (f64 for f64), masked scores -inf. A row
//     that may attend nothing (a padding token, negative doc id) gets out = 0, lse = -inf and zero
//     gradients, never NaN; a padding key gets dk = dv = 0.
//   - Dropout on the probabilities: P[b,h,i,j] is kept iff
//     random::dropout_keep(seed, offset + ((b*NH + h)*S + i)*S + j, p) and scaled by 1/(1-p), the
//     same bits as the CPU; lse is that of the undropped probabilities. Backward uses
//     D_i = dO_i . O_i, so `out` must be the forward's output.
// Algorithm (correctness first, deterministic, no atomics):
//   forward   one block per query row (b, h, i), key tiles of blockDim keys with an online
//             softmax (running max and sum, rescaled accumulator in shared memory);
//   backward  kernel A: one block per query row: D_i, and dq_i over key tiles;
//             kernel B: one block per key row (b, g, j): dk_j and dv_j over the group's heads and
//             query tiles, reading lse and D.
// cu_seqlens are validated on a host copy (one synchronisation, as they are tiny) and expanded to a
// per-position document id shared by every batch row. Not here: tensor cores, K/V tiles in shared
// memory, split-KV (the speed issue); sequence lengths differing between q and k/v; sliding
// windows.
#include <cmath>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/core/random/philox.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::AttentionArgs;

constexpr int kAttnThreads = 128;  // keys (or queries) per tile
constexpr int64_t kMaxHeadDim = 1024;

using Dims = ops::AttentionDims;

// Everything a kernel needs besides the tensors.
struct AttnParams {
  Dims d;
  DType t;      // storage dtype of q, k, v, out, dout, dq, dk, dv
  DType lse_t;  // f32, or f64 for f64
  bool causal;
  const int32_t* docs;  // document per (b, s): docs[b * doc_bstride + s]; null: no mask
  int64_t doc_bstride;  // S for doc_ids, 0 for cu_seqlens
  bool dropout;
  float p;
  uint64_t seed, offset;
};

__device__ __forceinline__ int64_t q_index(const Dims& d, int64_t s, int64_t b, int64_t h) {
  return ((s * d.b + b) * d.nh + h) * d.hd;
}
__device__ __forceinline__ int64_t kv_index(const Dims& d, int64_t s, int64_t b, int64_t g) {
  return ((s * d.b + b) * d.ng + g) * d.hd;
}

// Whether query i may attend key j (causality and documents; i itself is not padding).
__device__ __forceinline__ bool allowed(const AttnParams& a, int64_t b, int64_t i, int64_t j,
                                        int32_t doc_i) {
  if (a.causal && j > i) return false;
  return !a.docs || a.docs[b * a.doc_bstride + j] == doc_i;
}

template <typename C>
__device__ __forceinline__ C keep_factor(const AttnParams& a, int64_t row, int64_t j,
                                         C keep_scale) {
  if (!a.dropout) return C(1);
  const uint64_t e = a.offset + static_cast<uint64_t>(row * a.d.s + j);
  return random::dropout_keep(a.seed, e, a.p) ? keep_scale : C(0);
}

// sum_e x[e] * y[ybase + e], x in shared memory (C), y a storage row.
template <typename C>
__device__ __forceinline__ C dot_row(const C* x, const void* y, DType t, int64_t ybase,
                                     int64_t hd) {
  C s = 0;
  for (int64_t e = 0; e < hd; ++e) s += x[e] * load<C>(y, t, ybase + e);
  return s;
}

// Coordinates of query row r = (b*NH + h)*S + i: its KV group, q/out offset and document id.
struct QueryRow {
  int64_t i, b, h, g, qrow;
  int32_t doc;
};
__device__ __forceinline__ QueryRow query_row(const AttnParams& a, int64_t r) {
  const Dims& d = a.d;
  QueryRow q;
  q.i = r % d.s;
  const int64_t bh = r / d.s;
  q.h = bh % d.nh;
  q.b = bh / d.nh;
  q.g = q.h / (d.nh / d.ng);
  q.qrow = q_index(d, q.i, q.b, q.h);
  q.doc = a.docs ? a.docs[q.b * a.doc_bstride + q.i] : 0;
  return q;
}

// One block per query row r = (b*NH + h)*S + i.
template <typename C>
__global__ void attn_fwd_kernel(void* out, void* lse, const void* q, const void* k, const void* v,
                                AttnParams a, C scale, C keep_scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* sq = reinterpret_cast<C*>(smem_raw);
  C* acc = sq + a.d.hd;
  C* tile = acc + a.d.hd;
  const Dims& d = a.d;
  const int64_t r = block_row();
  if (r >= d.b * d.nh * d.s) return;
  const QueryRow row = query_row(a, r);
  const int64_t i = row.i, b = row.b, g = row.g, qrow = row.qrow;
  const int32_t doc_i = row.doc;
  if (doc_i < 0) {  // padding: attends nothing
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) store<C>(out, a.t, qrow + e, C(0));
    if (threadIdx.x == 0) store<C>(lse, a.lse_t, r, neg_inf<C>());
    return;
  }
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    sq[e] = load<C>(q, a.t, qrow + e);
    acc[e] = C(0);
  }
  __syncthreads();
  C m = neg_inf<C>(), l = C(0);
  const int64_t j_end = a.causal ? i + 1 : d.s;
  for (int64_t j0 = 0; j0 < j_end; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    C sc = neg_inf<C>();
    if (j < j_end && allowed(a, b, i, j, doc_i))
      sc = scale * dot_row(sq, k, a.t, kv_index(d, j, b, g), d.hd);
    const C tile_max = block_max(sc);
    if (tile_max == neg_inf<C>()) continue;  // uniform: nothing allowed in this tile
    const C m_new = tile_max > m ? tile_max : m;
    const C alpha = m == neg_inf<C>() ? C(0) : exp_c(m - m_new);
    const C pj = sc == neg_inf<C>() ? C(0) : exp_c(sc - m_new);
    l = l * alpha + block_sum(pj);
    tile[threadIdx.x] = pj == C(0) ? C(0) : pj * keep_factor<C>(a, r, j, keep_scale);
    __syncthreads();
    const int64_t width = j_end - j0 < blockDim.x ? j_end - j0 : blockDim.x;
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
      C s = acc[e] * alpha;
      for (int64_t jj = 0; jj < width; ++jj)
        if (tile[jj] != C(0)) s += tile[jj] * load<C>(v, a.t, kv_index(d, j0 + jj, b, g) + e);
      acc[e] = s;
    }
    __syncthreads();  // tile is rewritten by the next iteration
    m = m_new;
  }
  if (l == C(0)) {  // no key allowed (cannot happen for a non-padding row; kept for safety)
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) store<C>(out, a.t, qrow + e, C(0));
    if (threadIdx.x == 0) store<C>(lse, a.lse_t, r, neg_inf<C>());
    return;
  }
  const C inv = C(1) / l;
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x)
    store<C>(out, a.t, qrow + e, acc[e] * inv);
  if (threadIdx.x == 0) store<C>(lse, a.lse_t, r, m + log_c(l));
}

// Backward A: one block per query row: D_i = dO_i . O_i (kept in dbuf) and dq_i.
template <typename C>
__global__ void attn_bwd_dq_kernel(void* dq, C* dbuf, const void* dout, const void* q,
                                   const void* k, const void* v, const void* out, const void* lse,
                                   AttnParams a, C scale, C keep_scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* sq = reinterpret_cast<C*>(smem_raw);
  C* sdo = sq + a.d.hd;
  C* acc = sdo + a.d.hd;
  C* tile = acc + a.d.hd;
  const Dims& d = a.d;
  const int64_t r = block_row();
  if (r >= d.b * d.nh * d.s) return;
  const QueryRow row = query_row(a, r);
  const int64_t i = row.i, b = row.b, g = row.g, qrow = row.qrow;
  const int32_t doc_i = row.doc;
  const C lse_i = load<C>(lse, a.lse_t, r);
  if (doc_i < 0 || lse_i == neg_inf<C>()) {  // the row attended nothing: no gradient
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) store<C>(dq, a.t, qrow + e, C(0));
    if (threadIdx.x == 0) dbuf[r] = C(0);
    return;
  }
  C part = 0;
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    sq[e] = load<C>(q, a.t, qrow + e);
    sdo[e] = load<C>(dout, a.t, qrow + e);
    acc[e] = C(0);
    part += sdo[e] * load<C>(out, a.t, qrow + e);
  }
  const C di = block_sum(part);  // also the barrier after the shared-memory fill
  if (threadIdx.x == 0) dbuf[r] = di;
  const int64_t j_end = a.causal ? i + 1 : d.s;
  for (int64_t j0 = 0; j0 < j_end; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    C ds = 0;
    if (j < j_end && allowed(a, b, i, j, doc_i)) {
      const int64_t krow = kv_index(d, j, b, g);
      const C pj = exp_c(dot_row(sq, k, a.t, krow, d.hd) * scale - lse_i);
      const C zj = keep_factor<C>(a, r, j, keep_scale);
      ds = pj * (dot_row(sdo, v, a.t, krow, d.hd) * zj - di) * scale;
    }
    tile[threadIdx.x] = ds;
    __syncthreads();
    const int64_t width = j_end - j0 < blockDim.x ? j_end - j0 : blockDim.x;
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
      C s = acc[e];
      for (int64_t jj = 0; jj < width; ++jj)
        if (tile[jj] != C(0)) s += tile[jj] * load<C>(k, a.t, kv_index(d, j0 + jj, b, g) + e);
      acc[e] = s;
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) store<C>(dq, a.t, qrow + e, acc[e]);
}

// Backward B: one block per key row r = (b*NG + g)*S + j: dk_j and dv_j over the group's heads.
template <typename C>
__global__ void attn_bwd_dkv_kernel(void* dk, void* dv, const C* dbuf, const void* dout,
                                    const void* q, const void* k, const void* v, const void* lse,
                                    AttnParams a, C scale, C keep_scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* sk = reinterpret_cast<C*>(smem_raw);
  C* sv = sk + a.d.hd;
  C* acc_k = sv + a.d.hd;
  C* acc_v = acc_k + a.d.hd;
  C* tile_p = acc_v + a.d.hd;
  C* tile_s = tile_p + blockDim.x;
  const Dims& d = a.d;
  const int64_t r = block_row();
  if (r >= d.b * d.ng * d.s) return;
  const int64_t j = r % d.s, bg = r / d.s, g = bg % d.ng, b = bg / d.ng;
  const int64_t krow = kv_index(d, j, b, g);
  const int32_t doc_j = a.docs ? a.docs[b * a.doc_bstride + j] : 0;
  if (doc_j < 0) {  // a padding key: no query attends it
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
      store<C>(dk, a.t, krow + e, C(0));
      store<C>(dv, a.t, krow + e, C(0));
    }
    return;
  }
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    sk[e] = load<C>(k, a.t, krow + e);
    sv[e] = load<C>(v, a.t, krow + e);
    acc_k[e] = C(0);
    acc_v[e] = C(0);
  }
  __syncthreads();
  const int64_t per_group = d.nh / d.ng;
  const int64_t i_begin = a.causal ? j : 0;
  for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
    const int64_t row0 = (b * d.nh + h) * d.s;  // lse / dbuf / dropout row of query 0
    for (int64_t i0 = i_begin; i0 < d.s; i0 += blockDim.x) {
      const int64_t i = i0 + threadIdx.x;
      C pz = 0, ds = 0;
      if (i < d.s) {
        const int32_t doc_i = a.docs ? a.docs[b * a.doc_bstride + i] : 0;
        const C lse_i = load<C>(lse, a.lse_t, row0 + i);
        if (doc_i >= 0 && lse_i != neg_inf<C>() && allowed(a, b, i, j, doc_i)) {
          const int64_t qrow = q_index(d, i, b, h);
          C qk = 0, dov = 0;
          for (int64_t e = 0; e < d.hd; ++e) {
            qk += load<C>(q, a.t, qrow + e) * sk[e];
            dov += load<C>(dout, a.t, qrow + e) * sv[e];
          }
          const C pj = exp_c(qk * scale - lse_i);
          const C zj = keep_factor<C>(a, row0 + i, j, keep_scale);
          pz = pj * zj;
          ds = pj * (dov * zj - dbuf[row0 + i]) * scale;
        }
      }
      tile_p[threadIdx.x] = pz;
      tile_s[threadIdx.x] = ds;
      __syncthreads();
      const int64_t width = d.s - i0 < blockDim.x ? d.s - i0 : blockDim.x;
      for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
        C sum_v = acc_v[e], sum_k = acc_k[e];
        for (int64_t ii = 0; ii < width; ++ii) {
          const int64_t qrow = q_index(d, i0 + ii, b, h);
          if (tile_p[ii] != C(0)) sum_v += tile_p[ii] * load<C>(dout, a.t, qrow + e);
          if (tile_s[ii] != C(0)) sum_k += tile_s[ii] * load<C>(q, a.t, qrow + e);
        }
        acc_v[e] = sum_v;
        acc_k[e] = sum_k;
      }
      __syncthreads();
    }
  }
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    store<C>(dk, a.t, krow + e, acc_k[e]);
    store<C>(dv, a.t, krow + e, acc_v[e]);
  }
}

// ---- host side ------------------------------------------------------------------------------

// The contract (ops::validate_attention_*), then this kernel's head-dim limit.
void check_head_dim(const char* op, const Dims& d) {
  MG_CHECK(d.hd <= kMaxHeadDim,
           op << ": head dim " << d.hd << " exceeds this kernel's limit " << kMaxHeadDim);
}

// The document mask as device ids: doc_ids as given, or cu_seqlens expanded (into `holder`).
struct DocMask {
  const int32_t* ids = nullptr;
  int64_t bstride = 0;
  Scratch holder;
};

DocMask build_doc_mask(const char* op, const AttentionArgs& a, const Dims& d, const Tensor& q) {
  DocMask m;
  const bool has_doc = a.doc_ids.defined(), has_cu = a.cu_seqlens.defined();
  if (has_doc) {
    m.ids = static_cast<const int32_t*>(a.doc_ids.raw_data());
    m.bstride = d.s;
  } else if (has_cu) {
    const Tensor& cu = a.cu_seqlens;
    const int dev = q.device().index;
    std::vector<int32_t> c(static_cast<std::size_t>(cu.numel()));
    copy_to_host(c.data(), cu.raw_data(), c.size() * sizeof(int32_t), dev);
    const int64_t nd = cu.numel() - 1;
    ops::validate_cu_seqlens(op, c, d.s);
    std::vector<int32_t> ids(static_cast<std::size_t>(d.s), 0);
    for (int64_t doc = 0; doc < nd; ++doc)
      for (int64_t s = c[doc]; s < c[doc + 1]; ++s) ids[s] = static_cast<int32_t>(doc);
    if (d.s > 0) {
      m.holder = Scratch(dev, ids.size() * sizeof(int32_t));
      copy_to_device(m.holder.get(), ids.data(), ids.size() * sizeof(int32_t), dev);
    }
    m.ids = m.holder.as<int32_t>();
    m.bstride = 0;
  }
  return m;
}

AttnParams params_of(const Dims& d, DType t, const AttentionArgs& a, const DocMask& m) {
  AttnParams p;
  p.d = d;
  p.t = t;
  p.lse_t = ops::compute_dtype(t);
  p.causal = a.causal;
  p.docs = m.ids;
  p.doc_bstride = m.bstride;
  p.dropout = a.dropout.p > 0.0f;
  p.p = a.dropout.p;
  p.seed = a.dropout.seed;
  p.offset = a.dropout.offset;
  return p;
}

template <typename C>
C softmax_scale(const AttentionArgs& a, const Dims& d) {
  return a.softmax_scale != 0.0f ? static_cast<C>(a.softmax_scale)
                                 : C(1) / std::sqrt(static_cast<C>(d.hd));
}

template <typename C>
C keep_scale(const AttentionArgs& a) {
  return C(1) / (C(1) - static_cast<C>(a.dropout.p));
}

void attention_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionArgs& args) {
  const char* op = "attention_fwd";
  const Dims d = ops::validate_attention_fwd(OnCudaDevice{}, out, lse, q, k, v, args);
  check_head_dim(op, d);
  const DocMask m = build_doc_mask(op, args, d, q);
  if (q.numel() == 0) return;
  const int dev = q.device().index;
  DeviceGuard guard(dev);
  const AttnParams p = params_of(d, q.dtype(), args, m);
  with_compute(q.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const std::size_t smem = static_cast<std::size_t>(2 * d.hd + kAttnThreads) * sizeof(C);
    attn_fwd_kernel<C><<<grid_rows(d.b * d.nh * d.s), kAttnThreads, smem, current_stream(dev)>>>(
        out.raw_data(), lse.raw_data(), q.raw_data(), k.raw_data(), v.raw_data(), p,
        softmax_scale<C>(args, d), keep_scale<C>(args));
  });
  MG_CUDA_CHECK_LAUNCH();
}

void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const AttentionArgs& args) {
  const char* op = "attention_bwd";
  const Dims d =
      ops::validate_attention_bwd(OnCudaDevice{}, dq, dk, dv, dout, q, k, v, out, lse, args);
  check_head_dim(op, d);
  for (const Tensor* g : {&dq, &dk, &dv})
    for (const Tensor* in : {&dout, &q, &k, &v, &out, &lse})
      MG_CHECK(!overlaps(*g, *in), op << ": gradient " << g->str() << " overlaps an input");
  const DocMask m = build_doc_mask(op, args, d, q);
  if (q.numel() == 0) return;
  const int dev = q.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const AttnParams p = params_of(d, q.dtype(), args, m);
  with_compute(q.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const C scale = softmax_scale<C>(args, d), ks = keep_scale<C>(args);
    Scratch dbuf(dev, static_cast<std::size_t>(d.b * d.nh * d.s) * sizeof(C));
    const std::size_t smem_a = static_cast<std::size_t>(3 * d.hd + kAttnThreads) * sizeof(C);
    attn_bwd_dq_kernel<C><<<grid_rows(d.b * d.nh * d.s), kAttnThreads, smem_a, s>>>(
        dq.raw_data(), dbuf.as<C>(), dout.raw_data(), q.raw_data(), k.raw_data(), v.raw_data(),
        out.raw_data(), lse.raw_data(), p, scale, ks);
    MG_CUDA_CHECK_LAUNCH();
    const std::size_t smem_b = static_cast<std::size_t>(4 * d.hd + 2 * kAttnThreads) * sizeof(C);
    attn_bwd_dkv_kernel<C><<<grid_rows(d.b * d.ng * d.s), kAttnThreads, smem_b, s>>>(
        dk.raw_data(), dv.raw_data(), dbuf.as<C>(), dout.raw_data(), q.raw_data(), k.raw_data(),
        v.raw_data(), lse.raw_data(), p, scale, ks);
    MG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_attention_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::attention_fwd>(kPlatformName, &attention_fwd, "cuda:kernel");
  r.register_op<ops::OpId::attention_bwd>(kPlatformName, &attention_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
