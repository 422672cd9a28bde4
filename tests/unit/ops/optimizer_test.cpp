// Conformance tests of adamw_step, l2_norm_sq and multi_tensor_scale on every platform, against
// naive f64 references written from op_args.h (AdamArgs) and op_list.h.
//
// The dtype parameter picks the mixed-precision recipe: f64 -> f64 params and grads; f32 -> f32;
// bf16 / f16 -> f32 master params, bf16 / f16 grads and a bf16 / f16 model_param copy (Megatron's
// mixed-precision optimizer).
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::ops::AdamArgs;
using mg::ops::AdamParam;
using mg::test::make_tensor;
using mg::test::random_values;
using mg::test::to_doubles;
using mg::test::Tol;
using mg::test::tolerance;

// ---- naive reference: one AdamW step on one tensor, in f64
// ---------------------------------------

struct RefState {
  std::vector<double> p, m, v;
};

void ref_adam_step(RefState& s, const std::vector<double>& grad, const AdamArgs& a) {
  const double b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay, lr = a.lr, eps = a.eps;
  const double bc1 = a.bias_correction ? 1.0 - std::pow(b1, double(a.step)) : 1.0;
  const double bc2 = a.bias_correction ? 1.0 - std::pow(b2, double(a.step)) : 1.0;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double g = grad[i] * double(a.grad_scale);
    if (!a.decoupled_weight_decay) g += wd * s.p[i];
    s.m[i] = b1 * s.m[i] + (1 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
    const double mh = s.m[i] / bc1, vh = s.v[i] / bc2;
    double update = mh / (std::sqrt(vh) + eps);
    if (a.decoupled_weight_decay) update += wd * s.p[i];
    s.p[i] -= lr * update;
  }
}

class OptimizerTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  std::string platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  DType param_dtype() const { return dtype() == DType::f64 ? DType::f64 : DType::f32; }
  bool has_model_param() const { return dtype() == DType::bf16 || dtype() == DType::f16; }

  // One parameter on the device, with its reference state (from the rounded initial values).
  struct Slot {
    AdamParam t;
    RefState ref;
    Shape shape;
  };
  // grad_dtype: the gradient's dtype (default: the test's dtype; f32 = Megatron's main_grad).
  Slot make_slot(const Shape& shape, uint64_t seed,
                 std::optional<DType> grad_dtype = std::nullopt) const {
    const auto dev = mg::test::device_for(platform());
    const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
    Slot s;
    s.shape = shape;
    auto p = make_tensor(random_values(n, seed), shape, param_dtype(), dev);
    s.t.param = p.t;
    s.t.exp_avg = Tensor::zeros(shape, param_dtype(), dev);
    s.t.exp_avg_sq = Tensor::zeros(shape, param_dtype(), dev);
    s.t.grad = Tensor::zeros(shape, grad_dtype.value_or(dtype()), dev);
    if (has_model_param()) s.t.model_param = Tensor::zeros(shape, dtype(), dev);
    s.ref = {p.rounded, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    return s;
  }
  // New gradient for a slot; returns the rounded values the reference must use.
  std::vector<double> set_grad(Slot& s, uint64_t seed) const {
    const auto n = static_cast<std::size_t>(mg::shape_numel(s.shape));
    auto g = make_tensor(random_values(n, seed), s.shape, s.t.grad.dtype(), s.t.grad.device());
    s.t.grad.copy_(g.t);
    return g.rounded;
  }
  // `steps` AdamW steps of ops over slots against the reference (gradients seeded seed * step + i),
  // each slot checked after every step.
  void run_steps(std::vector<Slot>& slots, AdamArgs args, int64_t steps, uint64_t seed,
                 const std::string& what) const {
    const auto& ops = mg::test::ops_on(platform());
    for (int64_t step = 1; step <= steps; ++step) {
      args.step = step;
      std::vector<AdamParam> params;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const auto g = set_grad(slots[i], seed * static_cast<uint64_t>(step) + i);
        ref_adam_step(slots[i].ref, g, args);
        params.push_back(slots[i].t);
      }
      ops.adamw_step(params, args);
      for (std::size_t i = 0; i < slots.size(); ++i)
        expect_matches(slots[i], what + " step " + std::to_string(step) + " params[" +
                                     std::to_string(i) + "]");
    }
  }
  void expect_matches(const Slot& s, const std::string& what) const {
    const Tol tol = tolerance(param_dtype());
    EXPECT_TRUE(mg::test::all_close(to_doubles(s.t.param), s.ref.p, tol)) << what << " param";
    EXPECT_TRUE(mg::test::all_close(to_doubles(s.t.exp_avg), s.ref.m, tol)) << what << " exp_avg";
    EXPECT_TRUE(mg::test::all_close(to_doubles(s.t.exp_avg_sq), s.ref.v, tol))
        << what << " exp_avg_sq";
    if (has_model_param()) {  // exactly the master value rounded to the model dtype
      EXPECT_EQ(to_doubles(s.t.model_param), to_doubles(s.t.param.to(dtype())))
          << what << " model_param";
    }
  }
};

// Odd sizes, an empty one, one larger than a work chunk (16384 elements), and multiples of 4 (the
// CUDA vector kernel of f32 params and gradients).
const std::vector<Shape> kParamShapes = {{1},    {7},     {13, 31},  {0},
                                         {3, 5}, {20011}, {4, 1003}, {4096}};

TEST_P(OptimizerTest, AdamWSeveralStepsMatchReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  for (bool decoupled : {true, false}) {
    std::vector<Slot> slots;
    for (std::size_t i = 0; i < kParamShapes.size(); ++i)
      slots.push_back(make_slot(kParamShapes[i], 10 + i));
    AdamArgs args;
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    args.decoupled_weight_decay = decoupled;
    run_steps(slots, args, 4, 100, "decoupled " + std::to_string(decoupled));
  }
}

// Megatron's mixed precision: f32 master params and f32 main_grad, the model weight in bf16 / f16
// (the CUDA vector kernel for bf16 at sizes that are multiples of 4, the scalar one otherwise).
TEST_P(OptimizerTest, F32MainGradWithHalfModelParamMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  if (!has_model_param()) GTEST_SKIP() << "no model_param copy for " << dtype_name(dtype());
  std::vector<Slot> slots;
  const std::vector<Shape> shapes = {{4096}, {4, 1003}, {13, 31}, {20012}};
  for (std::size_t i = 0; i < shapes.size(); ++i)
    slots.push_back(make_slot(shapes[i], 40 + i, DType::f32));
  AdamArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  run_steps(slots, args, 3, 300, "f32 main_grad");
}

TEST_P(OptimizerTest, NoBiasCorrectionAndGradScale) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Slot s = make_slot({29}, 1);
  AdamArgs args;
  args.lr = 3e-3f;
  args.beta1 = 0.8f;
  args.beta2 = 0.95f;
  args.eps = 1e-6f;
  args.weight_decay = 0.05f;
  args.bias_correction = false;
  args.grad_scale = 0.25f;
  for (int64_t step = 1; step <= 3; ++step) {
    args.step = step;
    const auto g = set_grad(s, 50 + step);
    ref_adam_step(s.ref, g, args);
    const std::vector<AdamParam> params{s.t};
    ops.adamw_step(params, args);
    expect_matches(s, "step " + std::to_string(step));
  }
}

// grad_scale multiplies the gradient first: grads 4g with grad_scale 1/4 is the same step as g.
TEST_P(OptimizerTest, GradScaleUnscalesTheGradient) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Slot a = make_slot({23}, 3), b = make_slot({23}, 3);
  const auto g = set_grad(a, 4);
  std::vector<double> g4(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) g4[i] = 4 * g[i];  // exact in every dtype
  b.t.grad.copy_(make_tensor(g4, {23}, dtype(), b.t.grad.device()).t);
  AdamArgs args;
  args.weight_decay = 0.01f;
  ops.adamw_step(std::vector<AdamParam>{a.t}, args);
  args.grad_scale = 0.25f;
  ops.adamw_step(std::vector<AdamParam>{b.t}, args);
  EXPECT_EQ(to_doubles(a.t.param), to_doubles(b.t.param));
  EXPECT_EQ(to_doubles(a.t.exp_avg_sq), to_doubles(b.t.exp_avg_sq));
}

// At step 1 with bias correction, m^ = g' and v^ = g'^2, so the Adam direction is sign(g'):
//   decoupled (AdamW): p1 = p0 - lr * (sign(g) + wd * p0)
//   L2 (Adam):         p1 = p0 - lr * sign(g + wd * p0)
// With weight_decay = 0 the two modes are the same step.
TEST_P(OptimizerTest, DecoupledAndL2WeightDecayDifferAsExpected) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const Shape shape{31};
  // Gradients small next to wd * p for some elements, so sign(g + wd p) != sign(g) there.
  AdamArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.5f;
  args.eps = 1e-12f;
  auto run = [&](bool decoupled, float wd) {
    Slot s = make_slot(shape, 7);
    const auto g = set_grad(s, 8);
    AdamArgs a = args;
    a.decoupled_weight_decay = decoupled;
    a.weight_decay = wd;
    ops.adamw_step(std::vector<AdamParam>{s.t}, a);
    return std::tuple{s.ref.p, g, to_doubles(s.t.param)};
  };
  const auto [p0, g, p_adamw] = run(true, args.weight_decay);
  const auto [p0b, gb, p_l2] = run(false, args.weight_decay);
  const double lr = args.lr, wd = args.weight_decay;
  std::vector<double> exp_adamw(p0.size()), exp_l2(p0.size());
  int sign_flips = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const double gl2 = g[i] + wd * p0[i];
    exp_adamw[i] = p0[i] - lr * ((g[i] > 0 ? 1 : -1) + wd * p0[i]);
    exp_l2[i] = p0[i] - lr * (gl2 > 0 ? 1 : -1);
    sign_flips += (gl2 > 0) != (g[i] > 0);
  }
  const Tol tol = tolerance(param_dtype());
  EXPECT_TRUE(mg::test::all_close(p_adamw, exp_adamw, tol));
  EXPECT_TRUE(mg::test::all_close(p_l2, exp_l2, tol));
  EXPECT_GT(sign_flips, 0);  // the inputs do exercise the difference
  EXPECT_NE(p_adamw, p_l2);
  const auto [q0, qg, q_adamw] = run(true, 0.0f);
  const auto [q0b, qgb, q_l2] = run(false, 0.0f);
  EXPECT_EQ(q_adamw, q_l2);
}

TEST_P(OptimizerTest, AdamRejectsBadParams) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  auto expect_error = [&](const std::vector<AdamParam>& ps, const AdamArgs& a,
                          const std::string& needle) {
    try {
      ops.adamw_step(ps, a);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const mg::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Slot good = make_slot({5}, 1), bad = make_slot({5}, 2);
  bad.t.grad = Tensor::zeros({6}, dtype(), dev);
  expect_error({good.t, bad.t}, AdamArgs{}, "params[1]");
  bad = make_slot({5}, 2);
  bad.t.exp_avg_sq = Tensor::zeros({5}, DType::bf16, dev);
  expect_error({good.t, good.t, bad.t}, AdamArgs{}, "params[2]");
  bad = make_slot({5}, 2);
  bad.t.param = Tensor::zeros({5}, DType::bf16, dev);
  bad.t.exp_avg = Tensor::zeros({5}, DType::bf16, dev);
  bad.t.exp_avg_sq = Tensor::zeros({5}, DType::bf16, dev);
  expect_error({bad.t}, AdamArgs{}, "params[0]");
  bad = make_slot({5}, 2);
  bad.t.model_param = Tensor::zeros({4}, DType::bf16, dev);
  expect_error({bad.t}, AdamArgs{}, "[4]");
  AdamArgs a;
  a.step = 0;
  expect_error({good.t}, a, "step");
  a = AdamArgs{};
  a.beta1 = 1.0f;
  expect_error({good.t}, a, "beta1");
}

// ---- l2_norm_sq
// ----------------------------------------------------------------------------------

TEST_P(OptimizerTest, L2NormSqMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  // Tensors of this dtype plus f32 and bf16 ones (grads of mixed precision live side by side).
  std::vector<Tensor> xs;
  double expected = 0;
  uint64_t seed = 30;
  for (auto [shape, dt] : std::vector<std::pair<Shape, DType>>{{{1}, dtype()},
                                                               {{7, 3}, dtype()},
                                                               {{20011}, dtype()},
                                                               {{0}, dtype()},
                                                               {{31}, DType::f32},
                                                               {{13}, DType::bf16}}) {
    auto x = make_tensor(random_values(mg::shape_numel(shape), ++seed), shape, dt, dev);
    for (double v : x.rounded) expected += v * v;
    xs.push_back(x.t);
  }
  for (DType out_dtype : {DType::f64, DType::f32}) {
    Tensor out = Tensor::empty({1}, out_dtype, dev);
    ops.l2_norm_sq(out, xs);
    const Tol tol = out_dtype == DType::f64 ? Tol{0.0, 1e-12} : tolerance(DType::f32);
    EXPECT_TRUE(mg::test::all_close(to_doubles(out), {expected}, tol)) << dtype_name(out_dtype);
    Tensor again = Tensor::empty({1}, out_dtype, dev);
    ops.l2_norm_sq(again, xs);
    EXPECT_EQ(to_doubles(again), to_doubles(out));  // deterministic
  }
  Tensor out = Tensor::empty({1}, DType::f64, dev);
  ops.l2_norm_sq(out, std::vector<Tensor>{});
  EXPECT_EQ(to_doubles(out)[0], 0.0);
  Tensor bad_out = Tensor::empty({2}, DType::f64, dev);
  EXPECT_THROW(ops.l2_norm_sq(bad_out, xs), mg::Error);
}

// ---- multi_tensor_scale
// --------------------------------------------------------------------------

TEST_P(OptimizerTest, MultiTensorScaleMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  std::vector<Tensor> xs;
  std::vector<std::vector<double>> expected;
  std::vector<DType> dtypes;
  const double factor = 0.37;
  uint64_t seed = 60;
  for (auto [shape, dt] : std::vector<std::pair<Shape, DType>>{
           {{1}, dtype()}, {{13, 7}, dtype()}, {{20011}, dtype()}, {{17}, DType::f32}}) {
    auto x = make_tensor(random_values(mg::shape_numel(shape), ++seed), shape, dt, dev);
    std::vector<double> e = x.rounded;
    for (auto& v : e) v *= factor;
    xs.push_back(x.t);
    expected.push_back(e);
    dtypes.push_back(dt);
  }
  Tensor found = Tensor::zeros({1}, DType::f32, dev);
  ops.multi_tensor_scale(xs, factor, found);
  for (std::size_t i = 0; i < xs.size(); ++i)
    EXPECT_TRUE(mg::test::all_close(to_doubles(xs[i]), expected[i], tolerance(dtypes[i])))
        << "xs[" << i << "]";
  EXPECT_EQ(to_doubles(found)[0], 0.0);  // all finite: flag untouched
  Tensor none;
  ops.multi_tensor_scale(xs, 2.0, none);  // no flag at all is allowed
  EXPECT_TRUE(mg::test::all_close(to_doubles(xs[0]), {2 * expected[0][0]}, tolerance(dtype())));
}

TEST_P(OptimizerTest, MultiTensorScaleFlagsNonFinite) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  // A finite value that overflows this dtype when multiplied by 4.
  const double big = dtype() == DType::f64 ? 1e308 : dtype() == DType::f16 ? 60000.0 : 3e38;
  std::vector<double> vals = random_values(37, 5);
  vals[20] = big;
  std::vector<Tensor> xs{make_tensor(random_values(9, 4), {9}, dtype(), dev).t,
                         make_tensor(vals, {37}, dtype(), dev).t};
  Tensor found = Tensor::zeros({1}, DType::f32, dev);
  ops.multi_tensor_scale(xs, 4.0, found);
  EXPECT_EQ(to_doubles(found)[0], 1.0);
  EXPECT_TRUE(std::isinf(to_doubles(xs[1])[20]));
  // Never reset by the op: a later clean call leaves the flag at 1.
  std::vector<Tensor> clean{make_tensor(random_values(9, 6), {9}, dtype(), dev).t};
  ops.multi_tensor_scale(clean, 0.5, found);
  EXPECT_EQ(to_doubles(found)[0], 1.0);
  // NaN input is flagged too.
  std::vector<double> nan_vals = random_values(11, 7);
  nan_vals[10] = std::numeric_limits<double>::quiet_NaN();
  std::vector<Tensor> with_nan{make_tensor(nan_vals, {11}, dtype(), dev).t};
  Tensor found2 = Tensor::zeros({1}, DType::f32, dev);
  ops.multi_tensor_scale(with_nan, 0.5, found2);
  EXPECT_EQ(to_doubles(found2)[0], 1.0);
  Tensor bad_flag = Tensor::zeros({1}, DType::f64, dev);
  EXPECT_THROW(ops.multi_tensor_scale(clean, 0.5, bad_flag), mg::Error);
}

// ---- many tensors in one call
// --------------------------------------------------------------------
// The CUDA ops take the tensors of a call in multi-tensor launches (tables of up to 48 tensors,
// 32768-element chunks, a float4 body for 16-byte aligned f32 tensors and a scalar tail): more
// tensors than one table holds, sizes over a chunk, sizes that are not multiples of 4, f32 views at
// an odd element offset (not 16-byte aligned), and other dtypes among them must all be summed,
// scaled and stepped like one tensor at a time.

// Tensor i of the many-tensor set: its size, its dtype, whether it is an offset view.
struct ManySpec {
  int64_t n;
  DType dtype;
  bool offset_view;
};
std::vector<ManySpec> many_specs(DType dtype) {
  std::vector<ManySpec> specs;
  for (int i = 0; i < 110; ++i) {
    int64_t n = (i * 397) % 3001 + 1;
    if (i % 37 == 5) n += 70001;  // over two chunks, n % 4 != 0 for some
    const DType dt = i % 3 == 0 ? dtype : (i % 3 == 1 ? DType::f32 : DType::bf16);
    specs.push_back({n, dt, i % 5 == 2});
  }
  specs[7].n = 0;  // empty tensors are skipped
  return specs;
}
// The tensor of a spec (an offset view into a one-longer tensor when asked) and its values.
std::pair<Tensor, std::vector<double>> many_tensor(const ManySpec& sp, uint64_t seed,
                                                   mg::Device dev, double big = 0.0) {
  std::vector<double> v = random_values(static_cast<std::size_t>(sp.n), seed);
  if (big != 0.0 && !v.empty()) v[v.size() / 2] = big;
  if (!sp.offset_view) {
    auto x = make_tensor(v, {sp.n}, sp.dtype, dev);
    return {x.t, x.rounded};
  }
  std::vector<double> shifted(1, 0.5);
  shifted.insert(shifted.end(), v.begin(), v.end());
  auto x = make_tensor(shifted, {sp.n + 1}, sp.dtype, dev);
  return {x.t.slice(1, sp.n), std::vector<double>(x.rounded.begin() + 1, x.rounded.end())};
}

TEST_P(OptimizerTest, ManyTensorsL2NormSqAndScale) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const auto specs = many_specs(dtype());
  std::vector<Tensor> xs;
  std::vector<std::vector<double>> vals;
  double expected = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto [t, v] = many_tensor(specs[i], 500 + i, dev);
    for (double e : v) expected += e * e;
    xs.push_back(t);
    vals.push_back(v);
  }
  Tensor out = Tensor::empty({1}, DType::f64, dev);
  ops.l2_norm_sq(out, xs);
  EXPECT_TRUE(mg::test::all_close(to_doubles(out), {expected}, Tol{0.0, 1e-12}));
  Tensor again = Tensor::empty({1}, DType::f64, dev);
  ops.l2_norm_sq(again, xs);
  EXPECT_EQ(to_doubles(again), to_doubles(out));  // deterministic

  const double factor = 0.37;
  Tensor found = Tensor::zeros({1}, DType::f32, dev);
  ops.multi_tensor_scale(xs, factor, found);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    std::vector<double> want = vals[i];
    for (double& e : want) e *= factor;
    EXPECT_TRUE(mg::test::all_close(to_doubles(xs[i]), want, tolerance(specs[i].dtype)))
        << "xs[" << i << "] n " << specs[i].n << " offset " << specs[i].offset_view;
  }
  EXPECT_EQ(to_doubles(found)[0], 0.0);
  // One value that overflows, in a tensor of the third table: flagged.
  const std::size_t bad = 100;
  const double big = specs[bad].dtype == DType::f64   ? 1e308
                     : specs[bad].dtype == DType::f16 ? 60000.0
                                                      : 3e38;
  xs[bad] = many_tensor(specs[bad], 77, dev, big).first;
  ops.multi_tensor_scale(xs, 4.0, found);
  EXPECT_EQ(to_doubles(found)[0], 1.0);
}

TEST_P(OptimizerTest, ManyTensorsAdamW) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  std::vector<Slot> slots;
  const auto specs = many_specs(dtype());
  for (std::size_t i = 0; i < 60; ++i)  // f32 main grads (the multi-tensor kernel's case)
    slots.push_back(make_slot({specs[i].n}, 700 + i,
                              has_model_param() ? std::optional(DType::f32) : std::nullopt));
  AdamArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  run_steps(slots, args, 2, 900, "many tensors");
}

MG_INSTANTIATE_OP_TEST(OptimizerTest);

}  // namespace
