// CUDA rotary position embeddings (RoPE) on x [S, B, NH, HD] (any head count: q's NH or k's NG),
// Megatron's non-interleaved rotate_half form by default, interleaved on request.
//
// Gradient rule: no parameters; dx is an activation gradient and is written (=).
// Invariants: rot = int(HD * rotary_percent) must be even and > 0; features >= rot pass through.
// Pair i < rot/2 is (i, i + rot/2) (interleaved: (2i, 2i + 1)) and turns by
// pos * base^(-2i/rot): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), each written as one explicit
// product and one fused multiply-add (rope_first / rope_second: the contraction nvcc chose for
// the plain expressions before, now pinned, so every kernel rounds the same way). The backward is
// the rotation by the negative angle. y may alias x and dx may alias dy (each element is read
// before it is written, by the same thread).
// Positions come from position_ids ([S] or [B, S], i32/i64, on the device) or else are
// s + position_offset.
//
// cos/sin table: per device, an LRU of at most kMaxTables tables cos/sin [P, rot/2] indexed by the
// position value, keyed by (stream, compute type, rot, base, scaling arguments, sign) and covering
// positions [0, P), P a power of two >= max(4096, S + position_offset); a table covering more
// positions than a call needs serves it. A table does not depend on position_ids' content, so
// every call caches, with or without position_ids (the GPT model passes the batch's [B, S] ids),
// and the q and k calls of every layer, forward and backward, share two tables (one per sign).
// A position outside [0, P) (a negative one, a context-parallel chunk's, an unusual id) is
// computed in the apply kernel by the same function that fills the table: the same bits. Entries
// are built on a miss (one f64 kernel: angle in f64, cos/sin rounded to the compute type, f32 or
// f64 for f64 storage, as the CPU does); scaled frequencies (RopeArgs::scaling: linear, llama3,
// YaRN) come from ops::rope_inv_freq on the host, uploaded on a miss only. A table is used only on
// the stream that built it (the stream is in the key), so its build is ordered before every use;
// evicting one of another stream first waits for the device. Tables live in the caching
// allocator until evicted or process exit (there is no platform shutdown); rope_stats()
// (cuda_kernels.h) counts hits, misses and the kernels run.
//
// Apply kernels: bf16/f16 x with HD % 8 == 0 and x, y 16-byte aligned take the vector kernel when
// rot/2 % 8 == 0 (non-interleaved: a thread rotates 8 pairs (i..i+7, i+rot/2..i+rot/2+7) with two
// 16-byte loads and stores) or, interleaved, rot % 8 == 0 (4 pairs per 16-byte vector), with
// 32-bit indexing when the sizes allow; pass-through features are copied 8 at a time when y is not
// x. Everything else (f32, f64, other widths, misaligned views) takes the scalar kernel, one
// thread per feature pair. Both compute the same per-element expressions from the same table
// values: bit-identical (cuda_rope_test). Not here: fused q/k application, dynamic NTK, mrope
// sections, bshd.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <list>
#include <mutex>
#include <type_traits>
#include <vector>

#include "megatron/core/common/host_sync.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/ops/rope_scaling.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::RopeArgs;

constexpr int kMaxDevices = 64;
constexpr std::size_t kMaxTables = 8;  // per device
constexpr int64_t kMinTablePositions = 4096;

struct RopePlan {
  int64_t s, b, heads, hd, rot;
  // Positions: ids[b * S + s] (per batch), ids[s] (flat), or s + offset (no ids).
  const void* ids;
  DType ids_type;
  bool per_batch_positions;
  int64_t offset;
};

// What the table function needs: the frequencies and the table's extent.
template <typename C>
struct RopeTable {
  const C* cs;  // [positions, half]
  const C* sn;
  int64_t positions, half, rot;
  double base, sign, att;
  const double* scaled_inv_freq;  // [half] on the device, or null
};

// cos/sin(sign * pos * base^(-2i/rot)), or with scaled frequencies times the attention factor:
// the one definition of the table's values, also used for positions outside the table.
template <typename C>
__device__ __forceinline__ void rope_cos_sin(const RopeTable<C>& t, int64_t pos, int64_t i, C& c,
                                             C& s) {
  if (t.scaled_inv_freq) {
    const double ang = static_cast<double>(pos) * t.scaled_inv_freq[i];
    c = static_cast<C>(cos(ang) * t.att);
    s = static_cast<C>(t.sign * sin(ang) * t.att);
    return;
  }
  const double inv_freq = pow(t.base, -2.0 * static_cast<double>(i) / static_cast<double>(t.rot));
  const double ang = static_cast<double>(pos) * inv_freq;
  c = static_cast<C>(cos(ang));
  s = static_cast<C>(t.sign * sin(ang));
}

// The rotation of one pair, with the contraction pinned (see the file comment).
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, c, -__fmul_rn(x2, s));  // x1 c - x2 s
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, s, __fmul_rn(x2, c));  // x2 c + x1 s
}
__device__ __forceinline__ double rope_first(double x1, double x2, double c, double s) {
  return __fma_rn(x1, c, -__dmul_rn(x2, s));
}
__device__ __forceinline__ double rope_second(double x1, double x2, double c, double s) {
  return __fma_rn(x1, s, __dmul_rn(x2, c));
}

// cs/sn [positions, half] for positions 0, 1, ...
template <typename C>
__global__ void rope_table_kernel(C* cs, C* sn, RopeTable<C> t) {
  const int64_t total = t.positions * t.half;
  for (int64_t k = grid_start(); k < total; k += grid_stride()) {
    const int64_t pos = k / t.half, i = k - pos * t.half;
    rope_cos_sin(t, pos, i, cs[k], sn[k]);
  }
}

template <typename I>
__device__ __forceinline__ int64_t rope_position(const RopePlan& p, I s, I b) {
  if (!p.ids) return static_cast<int64_t>(s) + p.offset;
  const int64_t k = p.per_batch_positions ? static_cast<int64_t>(b) * p.s + s : s;
  return load_index(p.ids, p.ids_type, k);
}

// One thread per (row, pair) and per pass-through feature; rows are (s, b, head).
template <typename C>
__global__ void rope_apply_kernel(void* y, const void* x, DType t, RopeTable<C> tab, RopePlan p,
                                  bool interleaved, bool copy_rest) {
  const int64_t half = p.rot / 2;
  const int64_t per_row = half + (copy_rest ? p.hd - p.rot : 0);
  const int64_t rows = p.s * p.b * p.heads;
  const int64_t total = rows * per_row;
  for (int64_t k = grid_start(); k < total; k += grid_stride()) {
    const int64_t r = k / per_row, q = k - r * per_row;
    const int64_t base = r * p.hd;
    if (q >= half) {  // pass-through feature
      const int64_t e = p.rot + (q - half);
      store<C>(y, t, base + e, load<C>(x, t, base + e));
      continue;
    }
    const int64_t sb = r / p.heads;  // s * B + b
    const int64_t s = sb / p.b, b = sb - s * p.b;
    const int64_t pos = rope_position(p, s, b);
    C c, sv;
    if (pos >= 0 && pos < tab.positions) {
      c = tab.cs[pos * half + q];
      sv = tab.sn[pos * half + q];
    } else {
      rope_cos_sin(tab, pos, q, c, sv);
    }
    const int64_t i1 = interleaved ? 2 * q : q;
    const int64_t i2 = interleaved ? 2 * q + 1 : q + half;
    const C x1 = load<C>(x, t, base + i1), x2 = load<C>(x, t, base + i2);
    store<C>(y, t, base + i1, rope_first(x1, x2, c, sv));
    store<C>(y, t, base + i2, rope_second(x1, x2, c, sv));
  }
}

// N consecutive table values of pairs [i, i + N) at `pos` (16-byte loads: i and half are
// multiples of 4, the table 16-byte aligned), or computed where pos is outside the table.
template <int N>
__device__ __forceinline__ void rope_fetch(const RopeTable<float>& tab, int64_t pos, int64_t i,
                                           float (&c)[N], float (&s)[N]) {
  if (pos >= 0 && pos < tab.positions) {
    const int64_t o = pos * tab.half + i;
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 cv = *reinterpret_cast<const float4*>(tab.cs + o + k);
      const float4 sv = *reinterpret_cast<const float4*>(tab.sn + o + k);
      c[k] = cv.x, c[k + 1] = cv.y, c[k + 2] = cv.z, c[k + 3] = cv.w;
      s[k] = sv.x, s[k + 1] = sv.y, s[k + 2] = sv.z, s[k + 3] = sv.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) rope_cos_sin(tab, pos, i + k, c[k], s[k]);
}

// bf16/f16 x: one thread per 16-byte group of a row, I the index type (uint32_t when every index
// fits). Non-interleaved, group g < half/8 rotates pairs 8g..8g+7 (two vectors); interleaved,
// group g < rot/8 rotates the 4 pairs of features 8g..8g+7; the groups after those copy
// pass-through features (copy_rest).
template <typename I, bool kInterleaved>
__global__ void rope_apply_vec_kernel(void* y, const void* x, bool bf16, RopeTable<float> tab,
                                      RopePlan p, bool copy_rest) {
  const I half = static_cast<I>(p.rot / 2), hd = static_cast<I>(p.hd), rot = static_cast<I>(p.rot);
  const I heads = static_cast<I>(p.heads), nb = static_cast<I>(p.b);
  const I rot_groups = kInterleaved ? rot / 8 : half / 8;
  const I per_row = rot_groups + (copy_rest ? (hd - rot) / 8 : 0);
  const I total = static_cast<I>(p.s * p.b * p.heads) * per_row;
  for (I k = static_cast<I>(grid_start()); k < total; k += static_cast<I>(grid_stride())) {
    const I r = k / per_row, q = k - r * per_row;
    const I base = r * hd;
    if (q >= rot_groups) {  // pass-through features
      const I e = base + rot + (q - rot_groups) * 8;
      float v[8];
      load8_half(x, e, bf16, v);
      store8_half(y, e, bf16, v);
      continue;
    }
    const I sb = r / heads;
    const I s = sb / nb, b = sb - s * nb;
    const int64_t pos = rope_position(p, s, b);
    if constexpr (kInterleaved) {
      float c[4], sv[4], v[8], o[8];
      rope_fetch<4>(tab, pos, static_cast<int64_t>(q) * 4, c, sv);
      load8_half(x, base + q * 8, bf16, v);
#pragma unroll
      for (int k2 = 0; k2 < 4; ++k2) {
        o[2 * k2] = rope_first(v[2 * k2], v[2 * k2 + 1], c[k2], sv[k2]);
        o[2 * k2 + 1] = rope_second(v[2 * k2], v[2 * k2 + 1], c[k2], sv[k2]);
      }
      store8_half(y, base + q * 8, bf16, o);
    } else {
      const I i = q * 8;
      float c[8], sv[8], x1[8], x2[8], o1[8], o2[8];
      rope_fetch<8>(tab, pos, static_cast<int64_t>(i), c, sv);
      load8_half(x, base + i, bf16, x1);
      load8_half(x, base + half + i, bf16, x2);
#pragma unroll
      for (int k2 = 0; k2 < 8; ++k2) {
        o1[k2] = rope_first(x1[k2], x2[k2], c[k2], sv[k2]);
        o2[k2] = rope_second(x1[k2], x2[k2], c[k2], sv[k2]);
      }
      store8_half(y, base + i, bf16, o1);
      store8_half(y, base + half + i, bf16, o2);
    }
  }
}

// ---- the table cache --------------------------------------------------------------------------

bool same_scaling(const ops::RopeScaling& a, const ops::RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim &&
         a.correction_range_round_to_int == b.correction_range_round_to_int;
}

struct TableKey {
  cudaStream_t stream;
  bool f64;  // compute type double (f64 storage), else float
  int64_t rot;
  float base;
  ops::RopeScaling scaling;
  double sign;
  bool operator==(const TableKey& o) const {
    return stream == o.stream && f64 == o.f64 && rot == o.rot && base == o.base &&
           same_scaling(scaling, o.scaling) && sign == o.sign;
  }
};

struct TableEntry {
  TableKey key;
  int64_t positions = 0;
  Scratch table;  // cs [positions, half] then sn [positions, half], of the compute type
  Scratch freq;   // scaled inverse frequencies [half] (f64), or empty
};

struct TableCache {
  std::mutex mu;              // held from the lookup through the apply kernel's launch
  std::list<TableEntry> lru;  // most recently used first
};

TableCache& table_cache(int device) {
  static std::array<TableCache, kMaxDevices> caches;  // process lifetime
  return caches[static_cast<std::size_t>(device)];
}

struct Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, vector{0}, scalar{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

int64_t table_positions(int64_t need) {
  int64_t p = kMinTablePositions;
  while (p < need) p *= 2;
  return p;
}

// The cached table of `key` covering [0, need) (built on a miss), as the front of cache.lru.
// Called with cache.mu held.
template <typename C>
TableEntry& find_table(TableCache& cache, const TableKey& key, int64_t need, int dev,
                       const RopeArgs& a) {
  for (auto it = cache.lru.begin(); it != cache.lru.end(); ++it) {
    if (!(it->key == key) || it->positions < need) continue;
    counters().hits.fetch_add(1, std::memory_order_relaxed);
    if (it != cache.lru.begin()) cache.lru.splice(cache.lru.begin(), cache.lru, it);
    return cache.lru.front();
  }
  counters().misses.fetch_add(1, std::memory_order_relaxed);
  if (cache.lru.size() >= kMaxTables) {
    // Its kernels may still run: the stream-ordered free covers the current stream only.
    if (cache.lru.back().key.stream != key.stream) {
      count_host_sync(HostSync::kernel);
      MG_CUDA_CHECK(cudaDeviceSynchronize());
    }
    cache.lru.pop_back();
  }
  cudaStream_t s = key.stream;
  TableEntry e;
  e.key = key;
  e.positions = table_positions(need);
  const int64_t half = key.rot / 2;
  e.table = Scratch(dev, static_cast<std::size_t>(2 * e.positions * half) * sizeof(C));
  const double* scaled = nullptr;
  if (a.scaling.type != ops::RopeScalingType::none) {
    const std::vector<double> inv = ops::rope_inv_freq(a.base, key.rot, a.scaling);
    e.freq = Scratch(dev, inv.size() * sizeof(double));
    MG_CUDA_CHECK(cudaMemcpyAsync(e.freq.get(), inv.data(), inv.size() * sizeof(double),
                                  cudaMemcpyHostToDevice, s));
    count_host_sync(HostSync::kernel);
    MG_CUDA_CHECK(cudaStreamSynchronize(s));  // `inv` is pageable and dies here
    scaled = e.freq.as<double>();
  }
  C* cs = e.table.as<C>();
  C* sn = cs + e.positions * half;
  const RopeTable<C> t{cs,          sn,
                       e.positions, half,
                       key.rot,     static_cast<double>(a.base),
                       key.sign,    ops::rope_attention_scaling(a.scaling),
                       scaled};
  rope_table_kernel<C><<<grid_for(e.positions * half), kThreads, 0, s>>>(cs, sn, t);
  MG_CUDA_CHECK_LAUNCH();
  cache.lru.push_front(std::move(e));
  return cache.lru.front();
}

// ---- the ops ------------------------------------------------------------------------------------

RopePlan plan_rope(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                   const Tensor& in, const RopeArgs& a) {
  const ops::RopeDims d = ops::validate_rope(OnCudaDevice{}, op, out_name, out, in_name, in, a);
  const Tensor& ids = a.position_ids;
  return RopePlan{d.s,
                  d.b,
                  d.heads,
                  d.hd,
                  d.rot,
                  ids.defined() ? ids.raw_data() : nullptr,
                  ids.defined() ? ids.dtype() : DType::i64,
                  d.per_batch_positions,
                  a.position_offset};
}

// Whether the vector kernel serves the call (see the file comment).
bool rope_vec(const Tensor& y, const Tensor& x, const RopePlan& p, bool interleaved) {
  if (x.dtype() != DType::bf16 && x.dtype() != DType::f16) return false;
  if (p.hd % 8 != 0 || (interleaved ? p.rot % 8 : (p.rot / 2) % 8) != 0) return false;
  return aligned_for_8_halves(x.raw_data()) && aligned_for_8_halves(y.raw_data());
}

void rope_apply(Tensor& y, const Tensor& x, const RopePlan& p, const RopeArgs& a, double sign,
                bool force_scalar) {
  if (x.numel() == 0) return;
  const int dev = x.device().index;
  MG_CHECK(dev >= 0 && dev < kMaxDevices, "rope: device index " << dev << " too large");
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const int64_t half = p.rot / 2;
  // In place, the pass-through features are already where they belong.
  const bool copy_rest = y.raw_data() != x.raw_data() && p.rot < p.hd;
  // Positions the call needs from the table (others are computed: see the file comment).
  const int64_t need = p.ids ? p.s : p.s + std::max<int64_t>(p.offset, 0);
  TableCache& cache = table_cache(dev);
  std::lock_guard<std::mutex> lock(cache.mu);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const TableKey key{s, std::is_same_v<C, double>, p.rot, a.base, a.scaling, sign};
    const TableEntry& e = find_table<C>(cache, key, need, dev, a);
    const C* cs = e.table.as<C>();
    const RopeTable<C> tab{cs,
                           cs + e.positions * half,
                           e.positions,
                           half,
                           p.rot,
                           static_cast<double>(a.base),
                           sign,
                           ops::rope_attention_scaling(a.scaling),
                           e.freq.as<double>()};
    if constexpr (std::is_same_v<C, float>) {
      if (!force_scalar && rope_vec(y, x, p, a.interleaved)) {
        const bool bf16 = x.dtype() == DType::bf16;
        const int64_t groups = a.interleaved ? p.rot / 8 : half / 8;
        const int64_t per_row = groups + (copy_rest ? (p.hd - p.rot) / 8 : 0);
        const int64_t n = p.s * p.b * p.heads * per_row;
        // 32-bit indices when every element index (and the loop's overshoot) fits.
        const bool narrow =
            x.numel() + static_cast<int64_t>(grid_for(n)) * kThreads < (int64_t{1} << 32);
        auto launch = [&](auto index_tag) {
          using I = decltype(index_tag);
          if (a.interleaved)
            rope_apply_vec_kernel<I, true><<<grid_for(n), kThreads, 0, s>>>(
                y.raw_data(), x.raw_data(), bf16, tab, p, copy_rest);
          else
            rope_apply_vec_kernel<I, false><<<grid_for(n), kThreads, 0, s>>>(
                y.raw_data(), x.raw_data(), bf16, tab, p, copy_rest);
        };
        if (narrow)
          launch(uint32_t{});
        else
          launch(int64_t{});
        MG_CUDA_CHECK_LAUNCH();
        counters().vector.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    const int64_t per_row = half + (copy_rest ? p.hd - p.rot : 0);
    rope_apply_kernel<C><<<grid_for(p.s * p.b * p.heads * per_row), kThreads, 0, s>>>(
        y.raw_data(), x.raw_data(), x.dtype(), tab, p, a.interleaved, copy_rest);
    MG_CUDA_CHECK_LAUNCH();
    counters().scalar.fetch_add(1, std::memory_order_relaxed);
  });
}

// y [S, B, NH, HD] = rope(x [S, B, NH, HD]); backward: dx = rope^-1(dy).
void rope_run(Tensor& y, const Tensor& x, const RopeArgs& args, bool backward, bool force_scalar) {
  const char* op = backward ? "rope_bwd" : "rope_fwd";
  const char* out_name = backward ? "dx" : "y";
  const char* in_name = backward ? "dy" : "x";
  const RopePlan p = plan_rope(op, out_name, y, in_name, x, args);
  MG_CHECK(!overlaps(y, x) || y.raw_data() == x.raw_data(),
           op << ": " << out_name << " overlaps " << in_name
              << " at a different offset; alias them exactly or not at all");
  rope_apply(y, x, p, args, backward ? -1.0 : 1.0, force_scalar);
}

// y [S, B, NH, HD] = rope(x [S, B, NH, HD])
void rope_fwd(Tensor& y, const Tensor& x, const RopeArgs& args) {
  rope_run(y, x, args, false, false);
}

// dx [S, B, NH, HD] = rope^-1(dy [S, B, NH, HD])
void rope_bwd(Tensor& dx, const Tensor& dy, const RopeArgs& args) {
  rope_run(dx, dy, args, true, false);
}

}  // namespace

void register_rope_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::rope_fwd>(kPlatformName, &rope_fwd, "cuda:kernel");
  r.register_op<ops::OpId::rope_bwd>(kPlatformName, &rope_bwd, "cuda:kernel");
}

void rope_apply_with(Tensor& y, const Tensor& x, const ops::RopeArgs& args, bool backward,
                     bool force_scalar) {
  rope_run(y, x, args, backward, force_scalar);
}

RopeStats rope_stats() {
  RopeStats st;
  st.table_hits = counters().hits.load();
  st.table_misses = counters().misses.load();
  st.vector_calls = counters().vector.load();
  st.scalar_calls = counters().scalar.load();
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    TableCache& cache = table_cache(dev);
    std::lock_guard<std::mutex> lock(cache.mu);
    st.tables += cache.lru.size();
  }
  return st;
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::RopeStats mg_cuda_rope_stats() {
  return mg::platforms::cuda::rope_stats();
}

extern "C" void mg_cuda_rope_apply_with(mg::Tensor& y, const mg::Tensor& x,
                                        const mg::ops::RopeArgs& args, bool backward,
                                        bool force_scalar) {
  mg::platforms::cuda::rope_apply_with(y, x, args, backward, force_scalar);
}
