// CUDA scaled dot-product attention (forward and backward) on Megatron's sbhd layout, with GQA,
// causal (bottom-right aligned) and document masks (doc_ids [+ kv_doc_ids] or cu_seqlens),
// counter-based attention dropout, and key sequences of another length than the queries' (Sk);
// and attention_merge, the log-sum-exp merge of partial results (ring attention).
//
// Gradient rule: no parameters; dq, dk, dv are activation gradients and are written (=).
// Invariants (the contract of op_args.h, shared with megatron/platforms/cpu/attention.cpp):
//   - q, out, dq, dout [Sq, B, NH, HD]; k, v, dk, dv [Sk, B, NG, HD]; lse [B, NH, Sq] f32 (f64
//     for f64). Head h reads KV group h / (NH / NG); dk/dv sum over the heads of a group. Causal:
//     query i sees keys j <= i + Sk - Sq (off = Sk - Sq below).
//   - Scores and softmax in f32 for f32/bf16/f16 storage (f64 for f64), masked scores -inf. A row
//     that may attend nothing (a padding token, negative doc id) gets out = 0, lse = -inf and zero
//     gradients, never NaN; a padding key gets dk = dv = 0.
//   - Dropout on the probabilities: P[b,h,i,j] is kept iff
//     random::dropout_keep(seed, offset + ((b*NH + h)*Sq + i)*Sk + j, p) and scaled by 1/(1-p), the
//     same bits as the CPU; lse is that of the undropped probabilities. Backward uses
//     D_i = dO_i . O_i, so `out` must be the forward's output.
// Algorithms (deterministic, no atomics, the S x S matrix never materialised):
//   tiled (f32/bf16/f16 storage, head dim <= 128; FlashAttention-2's schedule, f32 FMA math, no
//   tensor cores yet):
//     forward   one block per 64-query tile of (b, h); 64-key K/V tiles staged in shared memory,
//               online softmax (running max and sum per row) in registers, causal tile skipping;
//     backward  D_i = dO_i . O_i (one warp per row), then dq: one block per query tile over its key
//               tiles, and dk/dv: one block per 64-key tile of (b, g) over the group's heads and
//               the query tiles that may attend it, reading lse and D.
//   rows (f64, head dim > 128, or preferred: MG_OP_PROVIDERS=attention_fwd=cuda:attention-rows,
//   attention_bwd=cuda:attention-rows), correctness first:
//     forward   one block per query row (b, h, i), key tiles of blockDim keys with an online
//               softmax (running max and sum, rescaled accumulator in shared memory);
//     backward  kernel A: one block per query row: D_i, and dq_i over key tiles;
//               kernel B: one block per key row (b, g, j): dk_j and dv_j over the group's heads and
//               query tiles, reading lse and D.
// Both compute every element with the same formulas (scale * q.k, exp(s - m), the same dropout
// bits); they differ only in summation order.
// cu_seqlens are validated on a host copy (one synchronisation, as they are tiny) and expanded to a
// per-position document id shared by every batch row.
// Tensor cores: attention_mma.cu's forward (mma.sync m16n8k16, FlashAttention-2's forward, P
// rounded to the dtype before PV) for bf16/f16 with head dim 64 or 128; opt-in
// (MG_OP_PROVIDERS=attention_fwd=cuda:attention-mma; cuda_attention_mma_test passed on an H200 in
// session 21); default unchanged.
// Each algorithm is its own registry provider with a supports predicate (cuda:attention-mma,
// cuda:attention-tiled, cuda:attention-rows, see register_attention_kernels), so the registry
// decides which runs and megatron_info's table names it. Not here: tensor cores in the backward,
// wgmma, skipping tiles that documents mask entirely, split-KV; sliding windows.
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
  int64_t off;           // Sk - Sq: query i sees keys j <= i + off under the causal mask
  const int32_t* docs;   // query document per (b, i): docs[b * doc_bstride + i]; null: no mask
  int64_t doc_bstride;   // Sq for doc_ids, 0 for cu_seqlens
  const int32_t* kdocs;  // key document per (b, j): kdocs[b * kdoc_bstride + j] (null iff docs is)
  int64_t kdoc_bstride;  // Sk for kv_doc_ids (or doc_ids when Sk == Sq), 0 for cu_seqlens
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
  if (a.causal && j > i + a.off) return false;
  return !a.docs || a.kdocs[b * a.kdoc_bstride + j] == doc_i;
}

template <typename C>
__device__ __forceinline__ C keep_factor(const AttnParams& a, int64_t row, int64_t j,
                                         C keep_scale) {
  if (!a.dropout) return C(1);
  const uint64_t e = a.offset + static_cast<uint64_t>(row * a.d.sk + j);
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
  const int64_t j_end = a.causal ? min(i + 1 + a.off, d.sk) : d.sk;
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
  if (l == C(0)) {  // no key allowed: causal with i + off < 0, or no key of the row's document
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
  const int64_t j_end = a.causal ? min(i + 1 + a.off, d.sk) : d.sk;
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

// Backward B: one block per key row r = (b*NG + g)*Sk + j: dk_j and dv_j over the group's heads.
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
  if (r >= d.b * d.ng * d.sk) return;
  const int64_t j = r % d.sk, bg = r / d.sk, g = bg % d.ng, b = bg / d.ng;
  const int64_t krow = kv_index(d, j, b, g);
  const int32_t doc_j = a.docs ? a.kdocs[b * a.kdoc_bstride + j] : 0;
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
  const int64_t i_begin = a.causal ? max(j - a.off, int64_t{0}) : 0;
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

// ---- tiled (FlashAttention-2 style) kernels, f32 math, head dim <= 128 ----------------------
//
// A block of kFaThreads = 256 threads owns a kFaTile x kFaTile (64 x 64) tile of scores; thread
// (ty, tx) = (tid / 16, tid % 16) computes rows ty*4 + r (r < 4) and columns tx + 16*c (c < 4), so
// the 16 threads of a row group are one half-warp and reduce a row with 4 shuffles in a fixed
// order (deterministic). Operand tiles live in shared memory as f32 with the head dim zero-padded
// to D (64 or 128; the padding adds exact zeros to every dot product) and rows padded to D + 1
// floats (conflict-free column reads). Masks, dropout bits and the per-element formulas are those
// of the row kernels above; only the summation order differs.
constexpr int kFaTile = 64;
constexpr int kFaThreads = 256;
constexpr int kFaPS = kFaTile + 4;  // row stride of a score tile in shared memory

template <int D>
struct FaLayout {
  static constexpr int DP = D + 1;  // row stride of an operand tile
  static constexpr int kOperand = kFaTile * DP;
  static constexpr int kScores = kFaTile * kFaPS;
};

// Stages rows [row0, row0 + 64) of a [S, B, heads, HD] tensor at (b, head) into dst (zero past S
// and past HD).
template <int D>
__device__ __forceinline__ void fa_stage(float* dst, const void* src, DType t, int64_t row0,
                                         int64_t s_len, int64_t b, int64_t nb, int64_t heads,
                                         int64_t head, int64_t hd) {
  constexpr int DP = D + 1;
  for (int idx = threadIdx.x; idx < kFaTile * D; idx += kFaThreads) {
    const int r = idx / D, e = idx % D;
    const int64_t s = row0 + r;
    float x = 0.0f;
    if (s < s_len && e < hd) x = load<float>(src, t, ((s * nb + b) * heads + head) * hd + e);
    dst[r * DP + e] = x;
  }
}

// acc[r][c] = sum_e A[ty*4 + r][e] * B[tx + 16c][e] over two staged operand tiles.
template <int D>
__device__ __forceinline__ void fa_dot_tile(float (&acc)[4][4], const float* a, const float* bm,
                                            int ty, int tx) {
  constexpr int DP = D + 1;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 8
  for (int e = 0; e < D; ++e) {
    float av[4], bv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) av[r] = a[(ty * 4 + r) * DP + e];
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = bm[(tx + 16 * c) * DP + e];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
  }
}

// out[r][c] += sum_j P[ty*4 + r][j] * X[j][tx + 16c] for c < D/16 (P a score tile, X an operand
// tile).
template <int D>
__device__ __forceinline__ void fa_mul_acc(float (&out)[4][D / 16], const float* p, const float* x,
                                           int ty, int tx) {
  constexpr int DP = D + 1;
#pragma unroll 4
  for (int j = 0; j < kFaTile; ++j) {
    float pv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) pv[r] = p[(ty * 4 + r) * kFaPS + j];
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      const float xv = x[j * DP + tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r) out[r][c] = fmaf(pv[r], xv, out[r][c]);
    }
  }
}

__device__ __forceinline__ float fa_row_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float fa_row_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Causal: the keys a query tile starting at i0 may see end before min(i0 + 64 + off, Sk) (<= 0:
// none).
__device__ __forceinline__ int64_t fa_causal_end(const AttnParams& a, int64_t i0) {
  const int64_t e = i0 + kFaTile + a.off;
  return e < a.d.sk ? e : a.d.sk;
}

// Block x = (b*NH + h) * tiles + (tiles - 1 - query tile): the longest causal tiles start first.
__device__ __forceinline__ void fa_block_coords(int64_t blocks_per_row, int64_t& bh,
                                                int64_t& tile) {
  bh = blockIdx.x / blocks_per_row;
  tile = blocks_per_row - 1 - blockIdx.x % blocks_per_row;
}

template <int D>
__global__ void __launch_bounds__(kFaThreads)
    fa_fwd_kernel(void* out, float* lse, const void* q, const void* k, const void* v, AttnParams a,
                  float scale, float keep_scale) {
  using L = FaLayout<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sq = reinterpret_cast<float*>(smem_raw);
  float* sk = sq + L::kOperand;
  float* sv = sk + L::kOperand;
  float* sp = sv + L::kOperand;
  int* doc_q = reinterpret_cast<int*>(sp + L::kScores);
  int* doc_k = doc_q + kFaTile;
  const Dims& d = a.d;
  const int64_t tiles = (d.s + kFaTile - 1) / kFaTile;
  int64_t bh, qt;
  fa_block_coords(tiles, bh, qt);
  const int64_t h = bh % d.nh, b = bh / d.nh, g = h / (d.nh / d.ng);
  const int64_t i0 = qt * kFaTile;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  fa_stage<D>(sq, q, a.t, i0, d.s, b, d.b, d.nh, h, d.hd);
  if (tid < kFaTile) {
    const int64_t i = i0 + tid;
    doc_q[tid] = i >= d.s ? -1 : (a.docs ? a.docs[b * a.doc_bstride + i] : 0);
  }
  float acc[4][D / 16];
  float m[4], l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < D / 16; ++c) acc[r][c] = 0.0f;
  }
  const int64_t j_end = a.causal ? fa_causal_end(a, i0) : d.sk;
  for (int64_t j0 = 0; j0 < j_end; j0 += kFaTile) {
    __syncthreads();  // the previous tile's sk / sv / sp are no longer read
    fa_stage<D>(sk, k, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
    fa_stage<D>(sv, v, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
    if (tid < kFaTile) {
      const int64_t j = j0 + tid;
      doc_k[tid] = j >= d.sk ? -2 : (a.docs ? a.kdocs[b * a.kdoc_bstride + j] : 0);
    }
    __syncthreads();
    float sc[4][4];
    fa_dot_tile<D>(sc, sq, sk, ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = i0 + ty * 4 + r;
      const int di = doc_q[ty * 4 + r];
      float tmax = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + tx + 16 * c;
        const bool ok = di >= 0 && j < d.sk && (!a.causal || j <= i + a.off) &&
                        (!a.docs || doc_k[tx + 16 * c] == di);
        sc[r][c] = ok ? scale * sc[r][c] : -INFINITY;
        tmax = fmaxf(tmax, sc[r][c]);
      }
      tmax = fa_row_max(tmax);
      const float m_new = fmaxf(m[r], tmax);
      const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
      float psum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float pj = sc[r][c] == -INFINITY ? 0.0f : expf(sc[r][c] - m_new);
        psum += pj;
        float pz = pj;
        if (a.dropout && pj != 0.0f) {
          const uint64_t e =
              a.offset + static_cast<uint64_t>((bh * d.s + i) * d.sk + j0 + tx + 16 * c);
          pz = random::dropout_keep(a.seed, e, a.p) ? pj * keep_scale : 0.0f;
        }
        sp[(ty * 4 + r) * kFaPS + tx + 16 * c] = pz;
      }
      l[r] = l[r] * alpha + fa_row_sum(psum);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < D / 16; ++c) acc[r][c] *= alpha;
    }
    __syncthreads();
    fa_mul_acc<D>(acc, sp, sv, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = i0 + ty * 4 + r;
    if (i >= d.s) continue;
    const bool none = l[r] == 0.0f;  // padding, or nothing allowed: out 0, lse -inf
    const float inv = none ? 0.0f : 1.0f / l[r];
    const int64_t qrow = q_index(d, i, b, h);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      const int e = tx + 16 * c;
      if (e < d.hd) store<float>(out, a.t, qrow + e, none ? 0.0f : acc[r][c] * inv);
    }
    if (tx == 0) lse[bh * d.s + i] = none ? -INFINITY : m[r] + logf(l[r]);
  }
}

// D_i = dO_i . O_i, one warp per query row r = (b*NH + h)*S + i.
__global__ void fa_bwd_delta_kernel(float* delta, const void* dout, const void* out, AttnParams a) {
  const Dims& d = a.d;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= d.b * d.nh * d.s) return;
  const int64_t i = r % d.s, bh = r / d.s, h = bh % d.nh, b = bh / d.nh;
  const int64_t row = q_index(d, i, b, h);
  float part = 0.0f;
  for (int64_t e = lane; e < d.hd; e += 32)
    part += load<float>(dout, a.t, row + e) * load<float>(out, a.t, row + e);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) delta[r] = part;
}

// dq for a 64-row query tile of (b, h), over the key tiles it may attend.
template <int D>
__global__ void __launch_bounds__(kFaThreads)
    fa_bwd_dq_kernel(void* dq, const float* delta, const void* dout, const void* q, const void* k,
                     const void* v, const float* lse, AttnParams a, float scale, float keep_scale) {
  using L = FaLayout<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sq = reinterpret_cast<float*>(smem_raw);
  float* sdo = sq + L::kOperand;
  float* sk = sdo + L::kOperand;
  float* sv = sk + L::kOperand;
  float* sds = sv + L::kOperand;
  float* slse = sds + L::kScores;
  float* sdelta = slse + kFaTile;
  int* doc_q = reinterpret_cast<int*>(sdelta + kFaTile);
  int* doc_k = doc_q + kFaTile;
  const Dims& d = a.d;
  const int64_t tiles = (d.s + kFaTile - 1) / kFaTile;
  int64_t bh, qt;
  fa_block_coords(tiles, bh, qt);
  const int64_t h = bh % d.nh, b = bh / d.nh, g = h / (d.nh / d.ng);
  const int64_t i0 = qt * kFaTile;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  fa_stage<D>(sq, q, a.t, i0, d.s, b, d.b, d.nh, h, d.hd);
  fa_stage<D>(sdo, dout, a.t, i0, d.s, b, d.b, d.nh, h, d.hd);
  if (tid < kFaTile) {
    const int64_t i = i0 + tid;
    int di = i >= d.s ? -1 : (a.docs ? a.docs[b * a.doc_bstride + i] : 0);
    const float li = i < d.s ? lse[bh * d.s + i] : -INFINITY;
    if (li == -INFINITY) di = -1;  // attended nothing: no gradient
    doc_q[tid] = di;
    slse[tid] = li;
    sdelta[tid] = i < d.s ? delta[bh * d.s + i] : 0.0f;
  }
  float acc[4][D / 16];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < D / 16; ++c) acc[r][c] = 0.0f;
  const int64_t j_end = a.causal ? fa_causal_end(a, i0) : d.sk;
  for (int64_t j0 = 0; j0 < j_end; j0 += kFaTile) {
    __syncthreads();
    fa_stage<D>(sk, k, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
    fa_stage<D>(sv, v, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
    if (tid < kFaTile) {
      const int64_t j = j0 + tid;
      doc_k[tid] = j >= d.sk ? -2 : (a.docs ? a.kdocs[b * a.kdoc_bstride + j] : 0);
    }
    __syncthreads();
    float sc[4][4], dp[4][4];
    fa_dot_tile<D>(sc, sq, sk, ty, tx);
    fa_dot_tile<D>(dp, sdo, sv, ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = i0 + ty * 4 + r;
      const int di = doc_q[ty * 4 + r];
      const float li = slse[ty * 4 + r], dli = sdelta[ty * 4 + r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + tx + 16 * c;
        const bool ok = di >= 0 && j < d.sk && (!a.causal || j <= i + a.off) &&
                        (!a.docs || doc_k[tx + 16 * c] == di);
        float ds = 0.0f;
        if (ok) {
          const float pj = expf(sc[r][c] * scale - li);
          float zj = 1.0f;
          if (a.dropout) {
            const uint64_t e = a.offset + static_cast<uint64_t>((bh * d.s + i) * d.sk + j);
            zj = random::dropout_keep(a.seed, e, a.p) ? keep_scale : 0.0f;
          }
          ds = pj * (dp[r][c] * zj - dli) * scale;
        }
        sds[(ty * 4 + r) * kFaPS + tx + 16 * c] = ds;
      }
    }
    __syncthreads();
    fa_mul_acc<D>(acc, sds, sk, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = i0 + ty * 4 + r;
    if (i >= d.s) continue;
    const int64_t qrow = q_index(d, i, b, h);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      const int e = tx + 16 * c;
      if (e < d.hd) store<float>(dq, a.t, qrow + e, acc[r][c]);
    }
  }
}

// dk, dv for a 64-key tile of (b, g), over the group's heads and the query tiles that may attend
// it. Here thread rows are keys and thread columns queries.
template <int D>
__global__ void __launch_bounds__(kFaThreads)
    fa_bwd_dkv_kernel(void* dk, void* dv, const float* delta, const void* dout, const void* q,
                      const void* k, const void* v, const float* lse, AttnParams a, float scale,
                      float keep_scale) {
  using L = FaLayout<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sk = reinterpret_cast<float*>(smem_raw);
  float* sv = sk + L::kOperand;
  float* sq = sv + L::kOperand;
  float* sdo = sq + L::kOperand;
  float* spz = sdo + L::kOperand;
  float* sds = spz + L::kScores;
  float* slse = sds + L::kScores;
  float* sdelta = slse + kFaTile;
  int* doc_q = reinterpret_cast<int*>(sdelta + kFaTile);
  int* doc_k = doc_q + kFaTile;
  const Dims& d = a.d;
  const int64_t tiles = (d.sk + kFaTile - 1) / kFaTile;
  int64_t bg, kt;
  // Key tile kt: with causal masks the first key tiles see the most queries; start them first.
  bg = blockIdx.x / tiles;
  kt = blockIdx.x % tiles;
  const int64_t g = bg % d.ng, b = bg / d.ng;
  const int64_t j0 = kt * kFaTile;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  fa_stage<D>(sk, k, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
  fa_stage<D>(sv, v, a.t, j0, d.sk, b, d.b, d.ng, g, d.hd);
  if (tid < kFaTile) {
    const int64_t j = j0 + tid;
    doc_k[tid] = j >= d.sk ? -2 : (a.docs ? a.kdocs[b * a.kdoc_bstride + j] : 0);
  }
  float acc_k[4][D / 16], acc_v[4][D / 16];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < D / 16; ++c) acc_k[r][c] = acc_v[r][c] = 0.0f;
  const int64_t per_group = d.nh / d.ng;
  // Causal: key j0 is first seen by query j0 - off (query tiles need not be tile-aligned here).
  const int64_t i_begin = a.causal ? (j0 - a.off > 0 ? j0 - a.off : 0) : 0;
  for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
    const int64_t bh = b * d.nh + h;
    for (int64_t i0 = i_begin; i0 < d.s; i0 += kFaTile) {
      __syncthreads();
      fa_stage<D>(sq, q, a.t, i0, d.s, b, d.b, d.nh, h, d.hd);
      fa_stage<D>(sdo, dout, a.t, i0, d.s, b, d.b, d.nh, h, d.hd);
      if (tid < kFaTile) {
        const int64_t i = i0 + tid;
        int di = i >= d.s ? -1 : (a.docs ? a.docs[b * a.doc_bstride + i] : 0);
        const float li = i < d.s ? lse[bh * d.s + i] : -INFINITY;
        if (li == -INFINITY) di = -1;
        doc_q[tid] = di;
        slse[tid] = li;
        sdelta[tid] = i < d.s ? delta[bh * d.s + i] : 0.0f;
      }
      __syncthreads();
      float sc[4][4], dp[4][4];
      fa_dot_tile<D>(sc, sk, sq, ty, tx);   // [key][query]
      fa_dot_tile<D>(dp, sv, sdo, ty, tx);  // [key][query]
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t j = j0 + ty * 4 + r;
        const int dj = doc_k[ty * 4 + r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int qi = tx + 16 * c;
          const int64_t i = i0 + qi;
          const int di = doc_q[qi];
          const bool ok =
              di >= 0 && dj != -2 && (!a.causal || j <= i + a.off) && (!a.docs || dj == di);
          float pz = 0.0f, ds = 0.0f;
          if (ok) {
            const float pj = expf(sc[r][c] * scale - slse[qi]);
            float zj = 1.0f;
            if (a.dropout) {
              const uint64_t e = a.offset + static_cast<uint64_t>((bh * d.s + i) * d.sk + j);
              zj = random::dropout_keep(a.seed, e, a.p) ? keep_scale : 0.0f;
            }
            pz = pj * zj;
            ds = pj * (dp[r][c] * zj - sdelta[qi]) * scale;
          }
          spz[(ty * 4 + r) * kFaPS + qi] = pz;
          sds[(ty * 4 + r) * kFaPS + qi] = ds;
        }
      }
      __syncthreads();
      fa_mul_acc<D>(acc_v, spz, sdo, ty, tx);
      fa_mul_acc<D>(acc_k, sds, sq, ty, tx);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t j = j0 + ty * 4 + r;
    if (j >= d.sk) continue;
    const int64_t krow = kv_index(d, j, b, g);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      const int e = tx + 16 * c;
      if (e < d.hd) {
        store<float>(dk, a.t, krow + e, acc_k[r][c]);
        store<float>(dv, a.t, krow + e, acc_v[r][c]);
      }
    }
  }
}

template <int D>
constexpr std::size_t fa_fwd_smem() {
  return (3 * FaLayout<D>::kOperand + FaLayout<D>::kScores) * sizeof(float) +
         2 * kFaTile * sizeof(int);
}
template <int D>
constexpr std::size_t fa_dq_smem() {
  return (4 * FaLayout<D>::kOperand + FaLayout<D>::kScores + 2 * kFaTile) * sizeof(float) +
         2 * kFaTile * sizeof(int);
}
template <int D>
constexpr std::size_t fa_dkv_smem() {
  return (4 * FaLayout<D>::kOperand + 2 * FaLayout<D>::kScores + 2 * kFaTile) * sizeof(float) +
         2 * kFaTile * sizeof(int);
}

// ---- host side ------------------------------------------------------------------------------

// The contract (ops::validate_attention_*), then this kernel's head-dim limit.
void check_head_dim(const char* op, const Dims& d) {
  MG_CHECK(d.hd <= kMaxHeadDim,
           op << ": head dim " << d.hd << " exceeds this kernel's limit " << kMaxHeadDim);
}

// The document mask as device ids: doc_ids (and kv_doc_ids) as given, or cu_seqlens expanded
// (into `holder`, shared by queries and keys as Sk == Sq then).
struct DocMask {
  const int32_t* ids = nullptr;
  int64_t bstride = 0;
  const int32_t* kids = nullptr;
  int64_t kbstride = 0;
  Scratch holder;
};

DocMask build_doc_mask(const char* op, const AttentionArgs& a, const Dims& d, const Tensor& q) {
  DocMask m;
  const bool has_doc = a.doc_ids.defined(), has_cu = a.cu_seqlens.defined();
  if (has_doc) {
    m.ids = static_cast<const int32_t*>(a.doc_ids.raw_data());
    m.bstride = d.s;
    const bool kv = a.kv_doc_ids.defined();
    m.kids = kv ? static_cast<const int32_t*>(a.kv_doc_ids.raw_data()) : m.ids;
    m.kbstride = kv ? d.sk : d.s;
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
    m.kids = m.ids;
    m.kbstride = 0;
  }
  return m;
}

AttnParams params_of(const Dims& d, DType t, const AttentionArgs& a, const DocMask& m) {
  AttnParams p;
  p.d = d;
  p.t = t;
  p.lse_t = ops::compute_dtype(t);
  p.causal = a.causal;
  p.off = d.sk - d.s;
  p.docs = m.ids;
  p.doc_bstride = m.bstride;
  p.kdocs = m.kids;
  p.kdoc_bstride = m.kbstride;
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

// ---- providers (registered at the bottom; the registry decides which runs, see registry.h) ----
// cuda:attention-tiled serves f32/bf16/f16 storage with head dim <= 128, cuda:attention-rows every
// call (the fallback), cuda:attention-mma (forward only, opt-in) bf16/f16 with head dim 64 or 128
// and 16-byte aligned q, k, v, out. The predicates look at q only: the function validates
// everything else (and throws the same errors whichever provider a malformed call reaches).
bool q_is_4d(const Tensor& q) {
  return q.defined() && q.dim() == 4;
}
bool tiled_serves(const Tensor& q) {
  return q_is_4d(q) && q.dtype() != DType::f64 && q.shape()[3] <= 128;
}
bool tiled_fwd_supports(Tensor&, Tensor&, const Tensor& q, const Tensor&, const Tensor&,
                        const AttentionArgs&) {
  return tiled_serves(q);
}
bool tiled_bwd_supports(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor& q, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&, const AttentionArgs&) {
  return tiled_serves(q);
}
bool mma_fwd_supports(Tensor& out, Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                      const AttentionArgs&) {
  if (!q_is_4d(q) || !out.defined() || !k.defined() || !v.defined()) return false;
  MmaAttentionFwd a;
  a.t = q.dtype();
  a.hd = q.shape()[3];
  a.out = out.raw_data();
  a.q = q.raw_data();
  a.k = k.raw_data();
  a.v = v.raw_data();
  return mma_attention_fwd_supported(a);
}

// One block per 64-row tile of `len` rows (Sq for queries, Sk for keys) of each (b, head) of
// `heads` heads.
unsigned fa_blocks(const Dims& d, int64_t heads, int64_t len) {
  const int64_t tiles = (len + kFaTile - 1) / kFaTile;
  const int64_t n = d.b * heads * tiles;
  MG_CHECK(n < (int64_t{1} << 31), "attention: too many tiles for one grid: " << n);
  return static_cast<unsigned>(n);
}

// What every provider does first: validation, the document mask, the kernel parameters.
struct AttnCall {
  Dims d;
  DocMask m;
  AttnParams p;
  int dev = 0;
};
AttnCall prepare_fwd(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const AttentionArgs& args) {
  const char* op = "attention_fwd";
  AttnCall c;
  c.d = ops::validate_attention_fwd(OnCudaDevice{}, out, lse, q, k, v, args);
  check_head_dim(op, c.d);
  c.m = build_doc_mask(op, args, c.d, q);
  c.p = params_of(c.d, q.dtype(), args, c.m);
  c.dev = q.device().index;
  return c;
}

// cuda:attention-tiled: one block per 64-query tile (FlashAttention-2's forward, f32 FMA).
void attention_fwd_tiled(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const AttentionArgs& args) {
  const AttnCall c = prepare_fwd(out, lse, q, k, v, args);
  if (q.numel() == 0) return;
  const Dims& d = c.d;
  MG_CHECK(tiled_serves(q), "attention_fwd (tiled): needs f32/bf16/f16 and head dim <= 128; got "
                                << dtype_name(q.dtype()) << ", head dim " << d.hd);
  DeviceGuard guard(c.dev);
  const float scale = softmax_scale<float>(args, d), ks = keep_scale<float>(args);
  const unsigned blocks = fa_blocks(d, d.nh, d.s);
  cudaStream_t s = current_stream(c.dev);
  auto launch = [&](auto kernel, std::size_t smem) {
    MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    kernel<<<blocks, kFaThreads, smem, s>>>(out.raw_data(), static_cast<float*>(lse.raw_data()),
                                            q.raw_data(), k.raw_data(), v.raw_data(), c.p, scale,
                                            ks);
  };
  if (d.hd <= 64)
    launch(fa_fwd_kernel<64>, fa_fwd_smem<64>());
  else
    launch(fa_fwd_kernel<128>, fa_fwd_smem<128>());
  MG_CUDA_CHECK_LAUNCH();
}

// cuda:attention-rows: one block per query row; any dtype and head dim (f64 math for f64).
void attention_fwd_rows(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionArgs& args) {
  const AttnCall c = prepare_fwd(out, lse, q, k, v, args);
  if (q.numel() == 0) return;
  const Dims& d = c.d;
  DeviceGuard guard(c.dev);
  with_compute(q.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const std::size_t smem = static_cast<std::size_t>(2 * d.hd + kAttnThreads) * sizeof(C);
    attn_fwd_kernel<C><<<grid_rows(d.b * d.nh * d.s), kAttnThreads, smem, current_stream(c.dev)>>>(
        out.raw_data(), lse.raw_data(), q.raw_data(), k.raw_data(), v.raw_data(), c.p,
        softmax_scale<C>(args, d), keep_scale<C>(args));
  });
  MG_CUDA_CHECK_LAUNCH();
}

// cuda:attention-mma: attention_mma.cu's tensor-core forward (launch_attention_fwd_mma checks
// that it serves the call).
void attention_fwd_mma(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionArgs& args) {
  const AttnCall c = prepare_fwd(out, lse, q, k, v, args);
  if (q.numel() == 0) return;
  const Dims& d = c.d;
  const AttnParams& p = c.p;
  DeviceGuard guard(c.dev);
  MmaAttentionFwd ma;
  ma.out = out.raw_data();
  ma.lse = static_cast<float*>(lse.raw_data());
  ma.q = q.raw_data();
  ma.k = k.raw_data();
  ma.v = v.raw_data();
  ma.t = q.dtype();
  ma.b = d.b;
  ma.sq = d.s;
  ma.sk = d.sk;
  ma.nh = d.nh;
  ma.ng = d.ng;
  ma.hd = d.hd;
  ma.causal = p.causal;
  ma.docs = p.docs;
  ma.doc_bstride = p.doc_bstride;
  ma.kdocs = p.kdocs;
  ma.kdoc_bstride = p.kdoc_bstride;
  ma.dropout = p.dropout;
  ma.p = p.p;
  ma.seed = p.seed;
  ma.offset = p.offset;
  ma.scale = softmax_scale<float>(args, d);
  ma.keep_scale = keep_scale<float>(args);
  ma.device = c.dev;
  launch_attention_fwd_mma(ma);
}

AttnCall prepare_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const AttentionArgs& args) {
  const char* op = "attention_bwd";
  AttnCall c;
  c.d = ops::validate_attention_bwd(OnCudaDevice{}, dq, dk, dv, dout, q, k, v, out, lse, args);
  check_head_dim(op, c.d);
  for (const Tensor* g : {&dq, &dk, &dv})
    for (const Tensor* in : {&dout, &q, &k, &v, &out, &lse})
      MG_CHECK(!overlaps(*g, *in), op << ": gradient " << g->str() << " overlaps an input");
  c.m = build_doc_mask(op, args, c.d, q);
  c.p = params_of(c.d, q.dtype(), args, c.m);
  c.dev = q.device().index;
  return c;
}

// cuda:attention-tiled: D = dO.O, then dq per query tile and dk/dv per key tile.
void attention_bwd_tiled(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                         const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const AttentionArgs& args) {
  const AttnCall c = prepare_bwd(dq, dk, dv, dout, q, k, v, out, lse, args);
  if (q.numel() == 0) return;
  const Dims& d = c.d;
  const AttnParams& p = c.p;
  const int dev = c.dev;
  MG_CHECK(tiled_serves(q), "attention_bwd (tiled): needs f32/bf16/f16 and head dim <= 128; got "
                                << dtype_name(q.dtype()) << ", head dim " << d.hd);
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const float scale = softmax_scale<float>(args, d), ks = keep_scale<float>(args);
  const int64_t rows = d.b * d.nh * d.s;
  Scratch delta(dev, static_cast<std::size_t>(rows) * sizeof(float));
  fa_bwd_delta_kernel<<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, s>>>(
      delta.as<float>(), dout.raw_data(), out.raw_data(), p);
  MG_CUDA_CHECK_LAUNCH();
  const float* lse_p = static_cast<const float*>(lse.raw_data());
  auto launch = [&](auto dq_kernel, std::size_t dq_smem, auto dkv_kernel, std::size_t dkv_smem) {
    MG_CUDA_CHECK(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(dq_smem)));
    dq_kernel<<<fa_blocks(d, d.nh, d.s), kFaThreads, dq_smem, s>>>(
        dq.raw_data(), delta.as<float>(), dout.raw_data(), q.raw_data(), k.raw_data(), v.raw_data(),
        lse_p, p, scale, ks);
    MG_CUDA_CHECK_LAUNCH();
    MG_CUDA_CHECK(cudaFuncSetAttribute(dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(dkv_smem)));
    dkv_kernel<<<fa_blocks(d, d.ng, d.sk), kFaThreads, dkv_smem, s>>>(
        dk.raw_data(), dv.raw_data(), delta.as<float>(), dout.raw_data(), q.raw_data(),
        k.raw_data(), v.raw_data(), lse_p, p, scale, ks);
    MG_CUDA_CHECK_LAUNCH();
  };
  if (d.hd <= 64)
    launch(fa_bwd_dq_kernel<64>, fa_dq_smem<64>(), fa_bwd_dkv_kernel<64>, fa_dkv_smem<64>());
  else
    launch(fa_bwd_dq_kernel<128>, fa_dq_smem<128>(), fa_bwd_dkv_kernel<128>, fa_dkv_smem<128>());
}

// cuda:attention-rows: kernel A per query row (D_i, dq_i), kernel B per key row (dk_j, dv_j).
void attention_bwd_rows(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionArgs& args) {
  const AttnCall c = prepare_bwd(dq, dk, dv, dout, q, k, v, out, lse, args);
  if (q.numel() == 0) return;
  const Dims& d = c.d;
  const AttnParams& p = c.p;
  const int dev = c.dev;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
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
    attn_bwd_dkv_kernel<C><<<grid_rows(d.b * d.ng * d.sk), kAttnThreads, smem_b, s>>>(
        dk.raw_data(), dv.raw_data(), dbuf.as<C>(), dout.raw_data(), q.raw_data(), k.raw_data(),
        v.raw_data(), lse.raw_data(), p, scale, ks);
    MG_CUDA_CHECK_LAUNCH();
  });
}

// attention_merge: one thread per row (b, h, i) of lse; out rows [HD] read and written in place.
template <typename C>
__global__ void attn_merge_kernel(void* out, void* lse, const void* bo, const void* bl, Dims d,
                                  DType t, DType lse_t) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= d.b * d.nh * d.s) return;
  const int64_t i = r % d.s, bh = r / d.s, h = bh % d.nh, b = bh / d.nh;
  const C l1 = load<C>(lse, lse_t, r), l2 = load<C>(bl, lse_t, r);
  if (l2 == neg_inf<C>()) return;  // the block attended nothing
  const int64_t row = ((i * d.b + b) * d.nh + h) * d.hd;
  C w1 = C(0), w2 = C(1), l = l2;
  if (l1 != neg_inf<C>()) {
    const C m = l1 > l2 ? l1 : l2;
    l = m + log_c(exp_c(l1 - m) + exp_c(l2 - m));
    w1 = exp_c(l1 - l);
    w2 = exp_c(l2 - l);
  }
  for (int64_t e = 0; e < d.hd; ++e) {
    const C o = w1 == C(0) ? C(0) : w1 * load<C>(out, t, row + e);
    store<C>(out, t, row + e, o + w2 * load<C>(bo, t, row + e));
  }
  store<C>(lse, lse_t, r, l);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  const Dims d = ops::validate_attention_merge(OnCudaDevice{}, out, lse, block_out, block_lse);
  if (out.numel() == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  const int64_t rows = d.b * d.nh * d.s;
  with_compute(out.dtype(), [&](auto tag) {
    using C = decltype(tag);
    attn_merge_kernel<C>
        <<<static_cast<unsigned>((rows + 255) / 256), 256, 0, current_stream(dev)>>>(
            out.raw_data(), lse.raw_data(), block_out.raw_data(), block_lse.raw_data(), d,
            out.dtype(), ops::compute_dtype(out.dtype()));
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_attention_kernels(plugin::Registry& r) {
  using ops::OpId;
  using plugin::Priority;
  // Ranked tiled > rows (same priority: the later registration ranks first), so the default table
  // runs the tiled kernels where they serve the call and the row kernels elsewhere; the
  // tensor-core forward ranks below both (opt-in: MG_OP_PROVIDERS=attention_fwd=cuda:attention-mma
  // or RuntimeOptions::op_providers), and then falls back to tiled, then rows.
  r.register_op<OpId::attention_fwd>(kPlatformName, &attention_fwd_rows, "cuda:attention-rows");
  r.register_op<OpId::attention_bwd>(kPlatformName, &attention_bwd_rows, "cuda:attention-rows");
  r.register_op<OpId::attention_fwd>(kPlatformName, &attention_fwd_tiled, "cuda:attention-tiled",
                                     Priority::platform, {.supports = &tiled_fwd_supports});
  r.register_op<OpId::attention_bwd>(kPlatformName, &attention_bwd_tiled, "cuda:attention-tiled",
                                     Priority::platform, {.supports = &tiled_bwd_supports});
  r.register_op<OpId::attention_fwd>(kPlatformName, &attention_fwd_mma, "cuda:attention-mma",
                                     Priority::alternative, {.supports = &mma_fwd_supports});
  r.register_op<OpId::attention_merge>(kPlatformName, &attention_merge, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
