// --fp8-param-gather's casts (docs/fp8.md "FP8 parameters"): Fp8State::quantize_param_shards (TE's
// cast_master_weights_to_fp8), the FP8 weight used as it is by cast_weight, dequantize_params.
// The reference is the whole-tensor fp8_cast_transpose (checked against ml_dtypes in
// fp8_recipe_test) of the master weights with the same scale:
//   - delayed: a weight cast from its master shards (uneven pieces, as the distributed optimizer
//     cuts them; the shards of two "ranks" in separate calls) equals the whole-tensor cast with the
//     weight's current scale, bit for bit; its amax (row 0, the weight's slot) is max |master|, the
//     inputs' slots stay 0; the parameter's scale_inv is 1 / scale, the value update() computed;
//     other parameters' shards (a bias) are skipped;
//   - the relation to casting the model-dtype (bf16) weight, what a run without the flag does:
//     the same FP8 value where the master is a bf16 value (e.g. the initial weights), at most one
//     FP8 step apart elsewhere (two roundings: f32 -> bf16 -> FP8 against f32 -> FP8);
//   - tensorwise: scale = 448 / max |master| over every shard, the same cast;
//   - cast_weight of the FP8 parameter: the bytes as they are, the transposes exact, the
//     parameter's scale_inv, no cast counted and no amax recorded; split into parts as well;
//   - dequantize_params: q * scale_inv in f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/dtype_math.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using fp8::Fp8Config;
using fp8::Fp8State;
using fp8::MasterShard;

// Two FP8 linears "la" [32, 16] and "lb" [16, 32] with a bias between them in one flat f32
// buffer (so the FP8 storage has two runs), and master weights of mixed magnitudes (some beyond
// 448 at scale 1: saturation).
struct Model {
  Tensor flat;
  std::vector<transformer::Parameter> params;
  std::vector<std::vector<float>> master;  // per param
};

Model make_model(uint32_t seed, float magnitude) {
  Model m;
  const std::vector<std::pair<std::string, Shape>> decl = {
      {"la.weight", {32, 16}}, {"la.bias", {32}}, {"lb.weight", {16, 32}}};
  int64_t total = 0;
  for (const auto& d : decl) total += shape_numel(d.second);
  m.flat = Tensor::zeros({total}, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, magnitude);
  int64_t off = 0;
  for (const auto& [name, shape] : decl) {
    transformer::Parameter p;
    p.name = name;
    p.buffer_offset = off;
    p.param = m.flat.slice(off, shape_numel(shape)).view(shape);
    p.global_shape = shape;
    std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
    for (float& x : v) x = nd(rng);
    v[3] = 500.0f * magnitude;  // beyond E4M3's 448 at scale 1
    m.master.push_back(v);
    m.params.push_back(p);
    off += shape_numel(shape);
  }
  return m;
}

Fp8State make_state(const Model& m, fp8::Fp8Recipe recipe) {
  Fp8Config cfg;
  cfg.format = fp8::Fp8Format::hybrid;
  cfg.recipe = recipe;
  cfg.param_gather = true;
  cfg.amax_history_len = 2;
  cfg.amax_compute_algo = fp8::AmaxComputeAlgo::max;
  Fp8State st(cfg, test::ops_on("cpu"), Device::cpu());
  st.add_linear("la");
  st.add_linear("lb");
  st.finalize();
  st.bind_params(m.params);
  return st;
}

// The master weights of param i, elements [lo, hi) of it, as a shard at its flat offset.
MasterShard shard(const Model& m, std::size_t i, int64_t lo, int64_t hi) {
  const auto& v = m.master[i];
  std::vector<float> part(v.begin() + lo, v.begin() + hi);
  return MasterShard{i, m.params[i].buffer_offset + lo, Tensor::from_vector(part, {hi - lo})};
}

std::vector<uint8_t> bytes_of(const Tensor& q) {
  const auto* p = static_cast<const uint8_t*>(q.raw_data());
  return std::vector<uint8_t>(p, p + q.numel());
}

// The reference: the whole weight cast with `scale` by the fixture-checked op; its amax.
std::vector<uint8_t> whole_cast(const std::vector<float>& w, const Shape& shape, float scale,
                                float* amax_out = nullptr) {
  Tensor x = Tensor::from_vector(w, shape), q = Tensor::empty(shape, DType::fp8_e4m3), none;
  Tensor amax = Tensor::from_vector(std::vector<float>{0.0f}, {1});
  test::ops_on("cpu").fp8_cast_transpose(q, none, amax, x,
                                         Tensor::from_vector(std::vector<float>{scale}, {1}));
  if (amax_out) *amax_out = amax.data<float>()[0];
  return bytes_of(q);
}

float max_abs(const std::vector<float>& v) {
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

// This rank's shards of every parameter when the flat buffer is cut at `cuts` (the distributed
// optimizer's uneven chunks): rank r gets [cuts[r], cuts[r + 1]).
std::vector<MasterShard> rank_shards(const Model& m, const std::vector<int64_t>& cuts, int r) {
  std::vector<MasterShard> out;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const int64_t a = m.params[i].buffer_offset, n = m.params[i].param.numel();
    const int64_t lo = std::max(a, cuts[static_cast<std::size_t>(r)]);
    const int64_t hi = std::min(a + n, cuts[static_cast<std::size_t>(r) + 1]);
    if (lo < hi) out.push_back(shard(m, i, lo - a, hi - a));
  }
  return out;
}

TEST(Fp8ParamGather, BindsTheWeightsInRuns) {
  const Model m = make_model(1, 1.0f);
  Fp8State st = make_state(m, fp8::Fp8Recipe::delayed);
  ASSERT_EQ(st.param_runs().size(), 2u);  // the bias sits between the weights
  EXPECT_EQ(st.param_runs()[0].start, 0);
  EXPECT_EQ(st.param_runs()[0].end, 512);
  EXPECT_EQ(st.param_runs()[1].start, 544);
  EXPECT_EQ(st.param_runs()[1].end, 1056);
  EXPECT_EQ(st.param_runs()[1].data.dtype(), DType::fp8_e4m3);
  EXPECT_EQ(st.linear_of_param(0), 0);
  EXPECT_EQ(st.linear_of_param(1), -1);
  EXPECT_EQ(st.linear_of_param(2), 1);
  EXPECT_EQ(st.param_q(1).shape(), (Shape{16, 32}));
  // Used before any cast from master weights: refused (the bytes would be zeros).
  EXPECT_THROW(st.cast_weight(1, st.param_q(1), {}, true, nullptr), Error);
}

TEST(Fp8ParamGather, DelayedShardsEqualTheWholeCastWithTheWeightScale) {
  Model m = make_model(2, 40.0f);
  Fp8State st = make_state(m, fp8::Fp8Recipe::delayed);
  const std::vector<int64_t> cuts = {0, 301, 777, 1056};  // three "ranks", uneven
  // Step 0 (TE's fp8_model_init): scale 1.
  for (int r = 0; r < 3; ++r) {
    const auto sh = rank_shards(m, cuts, r);
    st.quantize_param_shards(sh, nullptr, nullptr);
  }
  for (int id = 0; id < 2; ++id) {
    const std::size_t pi = id == 0 ? 0 : 2;
    float amax = 0.0f;
    EXPECT_EQ(bytes_of(st.param_q(id)),
              whole_cast(m.master[pi], m.params[pi].param.shape(), 1.0f, &amax))
        << "linear " << id;
    const auto h = st.history(true);
    EXPECT_EQ(h[static_cast<std::size_t>(2 * id + 1)], amax);  // the weight's slot, row 0
    EXPECT_EQ(amax, max_abs(m.master[pi]));
    EXPECT_EQ(h[static_cast<std::size_t>(2 * id)], 0.0f);  // the input's slot untouched
    EXPECT_EQ(st.param_scale_inv(id).data<float>()[0], 1.0f);
  }
  // The forward's update sets the weights' scales from those amaxes; the next step's masters
  // are cast with them.
  st.update(true, nullptr);
  const std::vector<float> scale = st.scale(true), scale_inv = st.scale_inv(true);
  for (auto& v : m.master)
    for (float& x : v) x = x * 0.75f + 0.01f;
  for (int r = 2; r >= 0; --r) {  // any order of the ranks
    const auto sh = rank_shards(m, cuts, r);
    st.quantize_param_shards(sh, nullptr, nullptr);
  }
  for (int id = 0; id < 2; ++id) {
    const std::size_t pi = id == 0 ? 0 : 2;
    const float s = scale[static_cast<std::size_t>(2 * id + 1)];
    ASSERT_NE(s, 1.0f);
    EXPECT_EQ(bytes_of(st.param_q(id)), whole_cast(m.master[pi], m.params[pi].param.shape(), s))
        << "linear " << id;
    EXPECT_EQ(st.param_scale_inv(id).data<float>()[0],
              scale_inv[static_cast<std::size_t>(2 * id + 1)]);
    EXPECT_EQ(st.param_scale_inv(id).data<float>()[0], 1.0f / s);
    EXPECT_EQ(st.history(true)[static_cast<std::size_t>(2 * id + 1)], max_abs(m.master[pi]));
  }
}

TEST(Fp8ParamGather, RelationToCastingTheBf16Weight) {
  const Model m = make_model(3, 0.05f);
  const float s = 448.0f / 0.07f;
  const std::vector<float>& w = m.master[0];
  std::vector<float> w16(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) w16[i] = bf16_to_f32_inline(f32_to_bf16_inline(w[i]));
  const auto q = whole_cast(w, {32, 16}, s), q16 = whole_cast(w16, {32, 16}, s);
  // Bf16 masters (the initial weights): identical.
  EXPECT_EQ(whole_cast(w16, {32, 16}, s), q16);
  int differ = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] == q16[i]) continue;
    ++differ;
    // Adjacent E4M3 codes of one sign (codes order as magnitudes do within a sign).
    EXPECT_EQ(q[i] & 0x80, q16[i] & 0x80) << i;
    EXPECT_EQ(std::abs(static_cast<int>(q[i] & 0x7F) - static_cast<int>(q16[i] & 0x7F)), 1)
        << "element " << i << ": " << w[i] << " vs bf16 " << w16[i];
  }
  EXPECT_GT(differ, 0);  // the two roundings do differ somewhere in 512 values
  EXPECT_LT(differ, static_cast<int>(q.size()) / 4);  // double rounding is the exception
  std::printf("bf16 vs f32 master casts: %d of %zu FP8 values one step apart\n", differ, q.size());
}

TEST(Fp8ParamGather, TensorwiseScaleFromTheMastersAmax) {
  const Model m = make_model(4, 3.0f);
  Fp8State st = make_state(m, fp8::Fp8Recipe::tensorwise);
  const std::vector<int64_t> cuts = {0, 100, 1056};
  // The amax is reduced over the ranks: here one call holds every rank's shards.
  std::vector<MasterShard> all = rank_shards(m, cuts, 0);
  for (const auto& x : rank_shards(m, cuts, 1)) all.push_back(x);
  st.quantize_param_shards(all, nullptr, nullptr);
  for (int id = 0; id < 2; ++id) {
    const std::size_t pi = id == 0 ? 0 : 2;
    const float s = fp8::current_scale(max_abs(m.master[pi]), 448.0f);
    EXPECT_EQ(s, 448.0f / max_abs(m.master[pi]));
    EXPECT_EQ(bytes_of(st.param_q(id)), whole_cast(m.master[pi], m.params[pi].param.shape(), s));
    EXPECT_EQ(st.param_scale_inv(id).data<float>()[0], 1.0f / s);
  }
}

TEST(Fp8ParamGather, CastWeightUsesTheFp8ParameterAsItIs) {
  const Model m = make_model(5, 2.0f);
  Fp8State st = make_state(m, fp8::Fp8Recipe::delayed);
  st.quantize_param_shards(rank_shards(m, {0, 1056}, 0), nullptr, nullptr);
  const auto history = st.history(true);
  const Tensor q = st.param_q(1);  // [16, 32]
  const auto qb = bytes_of(q);
  const fp8::WeightFp8 wf = st.cast_weight(1, q, {}, true, nullptr);
  ASSERT_EQ(wf.q.size(), 1u);
  EXPECT_EQ(bytes_of(wf.q[0]), qb);
  EXPECT_FALSE(wf.q[0].shares_storage_with(q));  // a copy: a ZeRO-3 release leaves it
  const auto qt = bytes_of(wf.qt[0]);
  ASSERT_EQ(wf.qt[0].shape(), (Shape{32, 16}));
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 32; ++c)
      ASSERT_EQ(qt[static_cast<std::size_t>(c * 16 + r)], qb[static_cast<std::size_t>(r * 32 + c)]);
  EXPECT_EQ(wf.scale_inv.data<float>()[0], st.param_scale_inv(1).data<float>()[0]);
  EXPECT_EQ(st.weight_casts(), 0);
  EXPECT_EQ(st.history(true), history);  // no amax recorded
  // Parts (forward_split): each part's rows and transpose.
  const std::vector<int64_t> rows = {4, 12};
  const fp8::WeightFp8 wp = st.cast_weight(1, q, rows, true, nullptr);
  ASSERT_EQ(wp.q.size(), 2u);
  const auto p1 = bytes_of(wp.q[1]), t1 = bytes_of(wp.qt[1]);
  for (int64_t r = 0; r < 12; ++r)
    for (int64_t c = 0; c < 32; ++c) {
      ASSERT_EQ(p1[static_cast<std::size_t>(r * 32 + c)],
                qb[static_cast<std::size_t>((4 + r) * 32 + c)]);
      ASSERT_EQ(t1[static_cast<std::size_t>(c * 12 + r)],
                qb[static_cast<std::size_t>((4 + r) * 32 + c)]);
    }
  // An FP8 weight of another format is refused (FP8 parameters are E4M3).
  EXPECT_THROW(st.cast_weight(1, Tensor::zeros({16, 32}, DType::fp8_e5m2), {}, true, nullptr),
               Error);
}

TEST(Fp8ParamGather, DequantizeIsQTimesScaleInv) {
  Model m = make_model(6, 30.0f);
  Fp8State st = make_state(m, fp8::Fp8Recipe::tensorwise);
  st.quantize_param_shards(rank_shards(m, {0, 1056}, 0), nullptr, nullptr);
  st.dequantize_params(m.params);
  for (int id = 0; id < 2; ++id) {
    const std::size_t pi = id == 0 ? 0 : 2;
    const float si = st.param_scale_inv(id).data<float>()[0];
    const auto qb = bytes_of(st.param_q(id));
    const float* p = m.params[pi].param.data<float>();
    for (std::size_t i = 0; i < qb.size(); ++i)
      ASSERT_EQ(p[i], fp8_e4m3_bits_to_f32(qb[i]) * si) << i;
  }
  const float* bias = m.params[1].param.data<float>();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bias[i], 0.0f);  // not an FP8 parameter
}

}  // namespace
}  // namespace mg
