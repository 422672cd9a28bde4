// Tensor-core attention forward (FlashAttention-2's forward on mma.sync.aligned.m16n8k16) for bf16
// and f16 storage with head dim 64 or 128. OPT-IN and UNVERIFIED: no GPU has run it yet;
// attention.cu registers it as the provider "cuda:attention-mma" of attention_fwd, below the tiled
// kernel, so it runs only where a run prefers it (MG_OP_PROVIDERS=attention_fwd=cuda:attention-mma
// or RuntimeOptions::op_providers), and then only for calls it serves (bf16/f16, head dim 64 or
// 128, 16-byte aligned q, k, v, out); other calls, and the backward, fall back to attention.cu's
// kernels. The test tests/unit/platforms/cuda/cuda_attention_mma_test.cpp compares
// it with the CPU.
//
// Semantics: exactly attention.cu's forward (op_args.h AttentionArgs): GQA (head h reads KV group
// h / (NH / NG)), bottom-right causal (query i sees keys j <= i + Sk - Sq), doc_ids / kv_doc_ids /
// cu_seqlens masks, padding rows (doc id < 0: out 0, lse -inf, never NaN), attention dropout with
// the CPU's Philox bits (random::dropout_keep(seed, offset + ((b*NH + h)*Sq + i)*Sk + j, p), kept
// probabilities scaled by 1/(1-p), lse of the undropped ones), lse [B, NH, Sq] f32.
// Schedule: one block of 4 warps per 64-query tile of (b, h), longest causal tiles first; warp w
// owns queries 16w..16w+15. Q is staged once (cp.async) and held in registers as mma A fragments
// (ldmatrix); 64-key K and V tiles stream through two shared-memory buffers with cp.async (the next
// tile loads while this one computes). S = Q K^T (bf16/f16 inputs, f32 accumulators, B fragments by
// ldmatrix), scale and masks in f32, online softmax (running max and sum per row, in f32 registers,
// reduced over the 4 lanes of a row), dropout on the f32 probabilities, then O += P V with P taken
// from the S accumulators as A fragments (no shared-memory round trip) and V by ldmatrix.trans.
// Causal: key tiles past the block's last visible key are skipped; tiles wholly visible to every
// row (no documents, in bounds, below the diagonal) skip the per-element mask.
// Numerics vs the f32-FMA kernel: scores, softmax, the row sums and O accumulate in f32 as there,
// but P (after dropout scaling) is rounded to the storage dtype before the PV product, as
// FlashAttention-2 does: each P element carries a relative error <= u (unit roundoff: 2^-8 bf16,
// 2^-11 f16), so out = sum_j P_j V_j / l moves by at most u * max|V| / (1 - p). The row sum l uses
// the unrounded P; lse is unaffected by the rounding.
// Resources (ptxas -v, sm_90, nvcc 13.0; no spills, 16-byte stack frame): head dim 64: 154
// registers, 46,592 B dynamic shared memory (3 blocks = 12 warps per SM); head dim 128: 224
// registers, 87,552 B (2 blocks = 8 warps per SM); bf16 and f16 alike.
// Not here: the backward (attention.cu's f32-FMA kernels serve it), head dims other than 64/128,
// f32 storage, wgmma / TMA (Hopper's asynchronous tensor cores), split-KV.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "megatron/core/random/philox.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"

namespace mg::platforms::cuda {

namespace {

constexpr int kMmaM = 64;  // queries per block (16 per warp)
constexpr int kMmaN = 64;  // keys per K/V tile
constexpr int kMmaThreads = 128;

template <int D>
struct MmaLayout {
  // Elements per shared-memory row: 16 bytes of padding make the 8 row addresses of an ldmatrix
  // 8x8 matrix fall into 8 distinct 16-byte bank groups (rows 144 / 272 bytes apart).
  static constexpr int kStride = D + 8;
  static constexpr int kTile = kMmaN * kStride;  // one Q, K or V tile (kMmaM == kMmaN)
  // Q, K[2], V[2] (2-byte elements), then the key documents of both K buffers.
  static constexpr std::size_t kBytes = 5 * static_cast<std::size_t>(kTile) * 2 + 2 * kMmaN * 4;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; valid = false writes 16 zero bytes (src not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// c += a * b for one m16n8k16 tile (row-major A, column-major B, f32 accumulators).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded (to nearest even) into one 32-bit register, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Stages rows [row0, row0 + 64) of a [len, B, heads, D] tensor at (b, head) into dst (row stride
// kStride), zero past len, with cp.async (the caller commits and waits).
template <typename T, int D>
__device__ __forceinline__ void stage_tile(T* dst, const T* src, int64_t row0, int64_t len,
                                           int64_t nb, int64_t b, int64_t heads, int64_t head) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kMmaN * kChunks; idx += kMmaThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int64_t s = row0 + r;
    const bool ok = s < len;
    const T* p = ok ? src + ((s * nb + b) * heads + head) * D + c * 8 : src;
    cp_async16(dst + r * MmaLayout<D>::kStride + c * 8, p, ok);
  }
}

// Thread layout of the m16n8 accumulators: lane holds rows lane/4 and lane/4 + 8 of its warp's 16,
// columns 8n + 2(lane%4) + {0, 1} of each 8-column tile n (c[0], c[1] the first row, c[2], c[3]
// the second).
template <typename T, int D>
__global__ void __launch_bounds__(kMmaThreads)
    mma_fwd_kernel(const MmaAttentionFwd a, int64_t tiles) {
  using L = MmaLayout<D>;
  constexpr int kS = L::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + L::kTile;                                   // two buffers
  T* sv = sk + 2 * L::kTile;                               // two buffers
  int* skdoc = reinterpret_cast<int*>(sv + 2 * L::kTile);  // two buffers of kMmaN
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const int64_t bh = blockIdx.x / tiles;
  const int64_t qt = tiles - 1 - blockIdx.x % tiles;  // longest causal tiles first
  const int64_t h = bh % a.nh, b = bh / a.nh, g = h / (a.nh / a.ng);
  const int64_t i0 = qt * kMmaM;
  const int64_t off = a.sk - a.sq;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // The keys this query tile may see end before j_end (causal: its last row's limit).
  int64_t j_end = a.sk;
  if (a.causal) {
    const int64_t e = i0 + kMmaM + off;
    j_end = e < a.sk ? e : a.sk;
  }
  const int64_t n_tiles = j_end <= 0 ? 0 : (j_end + kMmaN - 1) / kMmaN;

  auto stage_kv = [&](int buf, int64_t j0) {
    stage_tile<T, D>(sk + buf * L::kTile, k, j0, a.sk, a.b, b, a.ng, g);
    stage_tile<T, D>(sv + buf * L::kTile, v, j0, a.sk, a.b, b, a.ng, g);
    if (tid < kMmaN) {
      const int64_t j = j0 + tid;
      skdoc[buf * kMmaN + tid] = j >= a.sk ? -2 : (a.docs ? a.kdocs[b * a.kdoc_bstride + j] : 0);
    }
  };

  stage_tile<T, D>(sq, q, i0, a.sq, a.b, b, a.nh, h);
  if (n_tiles > 0) stage_kv(0, 0);
  cp_async_commit();

  // This thread's two query rows and their documents (-1: padding or past Sq).
  int64_t row[2];
  int doc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * 16 + (lane >> 2) + 8 * r;
    doc[r] = row[r] >= a.sq ? -1 : (a.docs ? a.docs[b * a.doc_bstride + row[r]] : 0);
  }

  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[D / 16][4];  // A fragments of the warp's 16 query rows
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
    ldmatrix_x4(qf[kc], sq + (warp * 16 + (lane & 15)) * kS + kc * 16 + (lane >> 4) * 8);

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int64_t t = 0; t < n_tiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    if (t + 1 < n_tiles) stage_kv(buf ^ 1, (t + 1) * kMmaN);
    cp_async_commit();   // possibly empty
    cp_async_wait<1>();  // tile t (every group but the one just committed) has landed
    __syncthreads();
    const T* kt = sk + buf * L::kTile;
    const T* vt = sv + buf * L::kTile;
    const int* kd = skdoc + buf * kMmaN;
    const int64_t j0 = t * kMmaN;

    // S = Q K^T: 8 tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // keys 16np..16np+15: b0, b1 of tiles 2np and 2np+1
        uint32_t kb[4];
        const int mi = lane >> 3;
        ldmatrix_x4(kb, kt + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * kS + kc * 16 + (mi & 1) * 8);
        mma16816<T>(s[2 * np], qf[kc], kb[0], kb[1]);
        mma16816<T>(s[2 * np + 1], qf[kc], kb[2], kb[3]);
      }
    }

    // Masks, online softmax and dropout, in f32; s becomes the (dropped, scaled) probabilities.
    const bool full = !a.docs && j0 + kMmaN <= a.sk && (!a.causal || j0 + kMmaN - 1 <= i0 + off);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = row[r];
      const int di = doc[r];
      float tmax = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = n * 8 + 2 * (lane & 3) + e;
          const int64_t j = j0 + jj;
          const bool ok = full || (di >= 0 && j < a.sk && (!a.causal || j <= i + off) &&
                                   (!a.docs || kd[jj] == di));
          float& x = s[n][2 * r + e];
          x = ok ? a.scale * x : -INFINITY;
          tmax = fmaxf(tmax, x);
        }
      tmax = quad_max(tmax);
      const float m_new = fmaxf(m[r], tmax);
      const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
      float psum = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[n][2 * r + e];
          const float pj = x == -INFINITY ? 0.0f : expf(x - m_new);
          psum += pj;
          float pz = pj;
          if (a.dropout && pj != 0.0f) {
            const int64_t j = j0 + n * 8 + 2 * (lane & 3) + e;
            const uint64_t el = a.offset + static_cast<uint64_t>((bh * a.sq + i) * a.sk + j);
            pz = random::dropout_keep(a.seed, el, a.p) ? pj * a.keep_scale : 0.0f;
          }
          x = pz;
        }
      l[r] = l[r] * alpha + quad_sum(psum);
      m[r] = m_new;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }

    // O += P V: P (rounded to T) straight from the accumulators as A fragments of 16 keys.
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
      pa[1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
      pa[2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      pa[3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {  // features 16dp..16dp+15: tiles 2dp, 2dp+1
        uint32_t vb[4];
        const int mi = lane >> 3;
        ldmatrix_x4_trans(
            vb, vt + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * kS + dp * 16 + (mi >> 1) * 8);
        mma16816<T>(o[2 * dp], pa, vb[0], vb[1]);
        mma16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // buffer buf is restaged by the next iteration's prefetch
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row[r];
    if (i >= a.sq) continue;
    const bool none = l[r] == 0.0f;  // padding, or nothing allowed: out 0, lse -inf
    const float inv = none ? 0.0f : 1.0f / l[r];
    T* orow = out + ((i * a.b + b) * a.nh + h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t w = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * (lane & 3)) = w;
    }
    if ((lane & 3) == 0) a.lse[bh * a.sq + i] = none ? -INFINITY : m[r] + logf(l[r]);
  }
}

template <typename T, int D>
void launch_typed(const MmaAttentionFwd& a) {
  const int64_t tiles = (a.sq + kMmaM - 1) / kMmaM;
  const int64_t blocks = a.b * a.nh * tiles;
  MG_CHECK(blocks < (int64_t{1} << 31),
           "attention_fwd (mma): too many tiles for one grid: " << blocks);
  constexpr std::size_t smem = MmaLayout<D>::kBytes;
  MG_CUDA_CHECK(cudaFuncSetAttribute(
      mma_fwd_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  mma_fwd_kernel<T, D>
      <<<static_cast<unsigned>(blocks), kMmaThreads, smem, current_stream(a.device)>>>(a, tiles);
  MG_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool mma_attention_fwd_supported(const MmaAttentionFwd& a) {
  return (a.t == DType::bf16 || a.t == DType::f16) && (a.hd == 64 || a.hd == 128) &&
         aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out);
}

void launch_attention_fwd_mma(const MmaAttentionFwd& a) {
  MG_CHECK(mma_attention_fwd_supported(a),
           "attention_fwd (mma): needs bf16/f16 storage, head dim 64 or 128 and 16-byte aligned "
           "tensors; got head dim "
               << a.hd);
  if (a.sq == 0 || a.b == 0 || a.nh == 0) return;
  if (a.t == DType::bf16) {
    if (a.hd == 64)
      launch_typed<__nv_bfloat16, 64>(a);
    else
      launch_typed<__nv_bfloat16, 128>(a);
  } else {
    if (a.hd == 64)
      launch_typed<__half, 64>(a);
    else
      launch_typed<__half, 128>(a);
  }
}

}  // namespace mg::platforms::cuda
