// FP8 quantisation and Transformer Engine's scaling recipes against an independent reference:
// tests/fixtures/fp8/fp8_fixture.txt (gen_fp8_fixture.py: ml_dtypes casts, numpy f32 recipe).
//   - fp8_cast_transpose on the CPU: q and qt bit for bit, amax exactly, for E4M3 and E5M2 at
//     several scales (saturation, subnormals, round-to-nearest-even ties).
//   - Delayed scaling through Fp8State: amaxes recorded by real casts into history row 0, then
//     update(): the history (roll, row 0 zeroed), scale and scale_inv bit for bit after every
//     step, for history lengths 1..16, both amax algorithms, margins 0..2; forward (input and
//     weight) and backward (gradient) slots; the state survives state_json / load_state_json.
//   - Tensorwise (current) scaling: current_scale and Fp8State::scaling's scale / scale_inv.
//   - fp8_gemm on the CPU against an f64 reference within the derived f32 accumulation bound; its
//     FP8 output the cast of its f32 output; fp8_transpose.
//   - fp8_scale_update (the op Fp8State::update runs) against delayed_update / current_scale on
//     random histories with zeros, NaN and Inf; bad shapes refused.
//   - The weight cache (TE's is_first_microbatch) on a 2-layer LLaMA through
//     forward_backward_no_pipelining: each FP8 weight cast once per call, not once per micro-batch;
//     losses and every gradient bit-identical to casting in every micro-batch where TE's semantics
//     give the same bytes (tensorwise scaling; delayed with one micro-batch); under delayed scaling
//     the later micro-batches record no weight amax (TE), the inputs' amaxes every time.
//   - SwiGLU fused into the FP8 casts (fp8_swiglu_cast_transpose / fp8_dswiglu_cast_transpose,
//     --no-bias-swiglu-fusion off): the same losses, gradients and amax histories as the separate
//     ops for both recipes, the fused functions called and the separate swiglu ops not, and the
//     separate path where a linear does not allow it (--no-fp8-wgrad); bad shapes refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/op_profiler.h"
#include "megatron/core/tensor/dtype_math.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/runtime.h"
#include "tests/unit/core/fp8/fp8_model_run.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using fp8::Fp8Config;
using fp8::Fp8State;

float from_hex(const std::string& h) {
  return std::bit_cast<float>(static_cast<uint32_t>(std::stoul(h, nullptr, 16)));
}
uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

std::vector<std::string> fixture_lines(const std::string& kind) {
  const std::string path = std::string(MG_TEST_FIXTURES_DIR) + "/fp8/fp8_fixture.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(kind + " ", 0) == 0 || line.rfind("step ", 0) == 0) out.push_back(line);
  return out;
}

// "l<i>" (appended, not "l" + to_string: GCC 12's bogus -Wrestrict at -O3, README "Developing").
std::string linear_name(int64_t i) {
  std::string s = "l";
  s += std::to_string(i);
  return s;
}

std::vector<uint8_t> bytes_of(const Tensor& q) {
  const auto* p = static_cast<const uint8_t*>(q.raw_data());
  return std::vector<uint8_t>(p, p + q.numel());
}

DType fmt_dtype(const std::string& f) {
  return f == "e4m3" ? DType::fp8_e4m3 : DType::fp8_e5m2;
}

TEST(Fp8Cast, MatchesMlDtypes) {
  const auto& ops = test::ops_on("cpu");
  int cases = 0;
  for (const std::string& line : fixture_lines("cast")) {
    if (line.rfind("cast ", 0) != 0) continue;
    std::istringstream ls(line);
    std::string kind, fmt, scale_h;
    int n = 0;
    ls >> kind >> fmt >> scale_h >> n;
    std::vector<float> x(static_cast<std::size_t>(n));
    std::vector<uint32_t> q(static_cast<std::size_t>(n));
    for (auto& v : x) {
      std::string h;
      ls >> h;
      v = from_hex(h);
    }
    for (auto& b : q) {
      std::string h;
      ls >> h;
      b = static_cast<uint32_t>(std::stoul(h, nullptr, 16));
    }
    std::string amax_h;
    ls >> amax_h;
    ASSERT_FALSE(ls.fail()) << line.substr(0, 60);
    ASSERT_EQ(n % 5, 0);
    const int64_t rows = 5, cols = n / 5;
    const Tensor xt = Tensor::from_vector(x, {rows, cols});
    const Tensor scale = Tensor::from_vector(std::vector<float>{from_hex(scale_h)}, {1});
    Tensor amax = Tensor::from_vector(std::vector<float>{0.0f}, {1});
    Tensor qt8 = Tensor::empty({rows, cols}, fmt_dtype(fmt));
    Tensor qtt = Tensor::empty({cols, rows}, fmt_dtype(fmt));
    ops.fp8_cast_transpose(qt8, qtt, amax, xt, scale);
    const auto* qp = static_cast<const uint8_t*>(qt8.raw_data());
    const auto* tp = static_cast<const uint8_t*>(qtt.raw_data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<std::size_t>(r * cols + c);
        ASSERT_EQ(qp[i], q[i]) << fmt << " scale " << scale_h << " x " << x[i];
        ASSERT_EQ(tp[c * rows + r], q[i]) << "transpose " << fmt << " x " << x[i];
      }
    EXPECT_EQ(bits(amax.data<float>()[0]), bits(from_hex(amax_h))) << fmt << " amax";
    // amax accumulates: a second cast of x / 2 leaves it; a larger value raises it.
    ++cases;
  }
  EXPECT_EQ(cases, 14);
}

TEST(Fp8Cast, AmaxAccumulatesAndPropagatesNaN) {
  const auto& ops = test::ops_on("cpu");
  Tensor amax = Tensor::from_vector(std::vector<float>{5.0f}, {1});
  const Tensor one = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  Tensor none, none2;
  ops.fp8_cast_transpose(none, none2, amax,
                         Tensor::from_vector(std::vector<float>{1, -3, 2, 0}, {2, 2}), one);
  EXPECT_EQ(amax.data<float>()[0], 5.0f);
  ops.fp8_cast_transpose(none, none2, amax,
                         Tensor::from_vector(std::vector<float>{1, -7, 2, 0}, {2, 2}), one);
  EXPECT_EQ(amax.data<float>()[0], 7.0f);
  ops.fp8_cast_transpose(none, none2, amax,
                         Tensor::from_vector(std::vector<float>{1, NAN, 2, 0}, {2, 2}), one);
  EXPECT_TRUE(std::isnan(amax.data<float>()[0]));
}

// Reads "delayed" blocks and replays them through Fp8State; forward: the slots are the input and
// weight of (slots / 2) linears (only for even slot counts), else the gradients of `slots` linears.
void replay_delayed(bool forward) {
  const auto& ops = test::ops_on("cpu");
  const std::vector<std::string> lines = fixture_lines("delayed");
  int blocks = 0;
  for (std::size_t li = 0; li < lines.size(); ++li) {
    if (lines[li].rfind("delayed ", 0) != 0) continue;
    std::istringstream hs(lines[li]);
    std::string kind, fmt, algo;
    int64_t len = 0, slots = 0, margin = 0, steps = 0;
    hs >> kind >> fmt >> len >> slots >> margin >> algo >> steps;
    if (forward && (slots % 2 != 0 || fmt != "e4m3")) continue;  // forward casts are E4M3
    Fp8Config cfg;
    cfg.format = fmt == "e4m3" ? fp8::Fp8Format::e4m3 : fp8::Fp8Format::hybrid;
    cfg.amax_history_len = len;
    cfg.margin = margin;
    cfg.amax_compute_algo =
        algo == "max" ? fp8::AmaxComputeAlgo::max : fp8::AmaxComputeAlgo::most_recent;
    Fp8State st(cfg, ops, Device::cpu());
    const int64_t linears = forward ? slots / 2 : slots;
    for (int64_t i = 0; i < linears; ++i) st.add_linear(linear_name(i));
    st.finalize();
    for (int64_t s = 0; s < steps; ++s) {
      std::istringstream ls(lines[li + 1 + static_cast<std::size_t>(s)]);
      std::string step;
      ls >> step;
      auto read = [&](int64_t n) {
        std::vector<float> v(static_cast<std::size_t>(n));
        for (auto& f : v) {
          std::string h;
          ls >> h;
          f = from_hex(h);
        }
        return v;
      };
      const std::vector<float> rec = read(slots), hist = read(len * slots), scale = read(slots),
                               scale_inv = read(slots);
      ASSERT_FALSE(ls.fail());
      for (int64_t j = 0; j < slots; ++j) {
        // Two casts per slot: half the amax, then the amax (row 0 keeps the max of the pass).
        const int id = static_cast<int>(forward ? j / 2 : j);
        const fp8::Role role = !forward     ? fp8::Role::grad_output
                               : j % 2 == 0 ? fp8::Role::input
                                            : fp8::Role::weight;
        for (float v :
             {rec[static_cast<std::size_t>(j)] * 0.5f, -rec[static_cast<std::size_t>(j)]}) {
          const Tensor x = Tensor::from_vector(std::vector<float>{v, 0.0f}, {1, 2});
          const fp8::Scaling sc =
              st.scaling(id, role, std::span<const Tensor>(&x, 1), true, nullptr);
          Tensor q;
          st.cast(sc, x, &q, nullptr);
        }
      }
      st.update(forward, nullptr);
      const auto h = st.history(forward), sc = st.scale(forward), si = st.scale_inv(forward);
      for (std::size_t i = 0; i < hist.size(); ++i)
        ASSERT_EQ(bits(h[i]), bits(hist[i])) << fmt << " len " << len << " step " << s << " h" << i;
      for (std::size_t i = 0; i < scale.size(); ++i) {
        ASSERT_EQ(bits(sc[i]), bits(scale[i])) << fmt << " len " << len << " step " << s;
        ASSERT_EQ(bits(si[i]), bits(scale_inv[i])) << fmt << " len " << len << " step " << s;
      }
      // The checkpoint form restores the same state into a fresh one.
      Fp8State copy(cfg, ops, Device::cpu());
      for (int64_t i = 0; i < linears; ++i) copy.add_linear(linear_name(i));
      copy.finalize();
      copy.load_state_json(nlohmann::json::parse(st.state_json().dump()));
      EXPECT_EQ(copy.history(forward), h);
      EXPECT_EQ(copy.scale(forward), sc);
      EXPECT_EQ(copy.scale_inv(forward), si);
    }
    ++blocks;
  }
  EXPECT_EQ(blocks, forward ? 2 : 10);
}

TEST(Fp8Delayed, BackwardSlotsMatchReference) {
  replay_delayed(false);
}
TEST(Fp8Delayed, ForwardSlotsMatchReference) {
  replay_delayed(true);
}

TEST(Fp8Delayed, EvaluationRecordsNothing) {
  Fp8Config cfg;
  cfg.format = fp8::Fp8Format::hybrid;
  Fp8State st(cfg, test::ops_on("cpu"), Device::cpu());
  st.add_linear("a");
  st.finalize();
  const Tensor x = Tensor::from_vector(std::vector<float>{3.0f, 1.0f}, {1, 2});
  const fp8::Scaling s =
      st.scaling(0, fp8::Role::input, std::span<const Tensor>(&x, 1), false, nullptr);
  Tensor q;
  st.cast(s, x, &q, nullptr);
  EXPECT_EQ(st.history(true), (std::vector<float>{0.0f, 0.0f}));
}

TEST(Fp8Delayed, CheckpointStateRefusesAnotherHistoryLength) {
  Fp8Config cfg;
  cfg.format = fp8::Fp8Format::hybrid;
  cfg.amax_history_len = 4;
  Fp8State a(cfg, test::ops_on("cpu"), Device::cpu());
  a.add_linear("a");
  a.finalize();
  cfg.amax_history_len = 2;
  Fp8State b(cfg, test::ops_on("cpu"), Device::cpu());
  b.add_linear("a");
  b.finalize();
  try {
    b.load_state_json(a.state_json());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("amax history length 4"), std::string::npos) << e.what();
  }
}

TEST(Fp8Tensorwise, MatchesReference) {
  int n = 0;
  for (const std::string& line : fixture_lines("tensorwise")) {
    if (line.rfind("tensorwise ", 0) != 0) continue;
    std::istringstream ls(line);
    std::string kind, fmt, a, s, si;
    ls >> kind >> fmt >> a >> s >> si;
    const float amax = from_hex(a);
    const float sc = fp8::current_scale(amax, fp8::fp8_max(fmt_dtype(fmt)));
    EXPECT_EQ(bits(sc), bits(from_hex(s))) << fmt << " amax " << amax;
    EXPECT_EQ(bits(1.0f / sc), bits(from_hex(si))) << fmt << " amax " << amax;
    if (std::isfinite(amax) && amax > 0 && amax < 1e20f) {  // through Fp8State::scaling too
      Fp8Config cfg;
      cfg.format = fmt == "e4m3" ? fp8::Fp8Format::e4m3 : fp8::Fp8Format::hybrid;
      cfg.recipe = fp8::Fp8Recipe::tensorwise;
      Fp8State st(cfg, test::ops_on("cpu"), Device::cpu());
      st.add_linear("a");
      st.finalize();
      const Tensor x = Tensor::from_vector(std::vector<float>{amax * 0.25f, -amax}, {1, 2});
      const fp8::Scaling g =
          st.scaling(0, fp8::Role::grad_output, std::span<const Tensor>(&x, 1), true, nullptr);
      EXPECT_EQ(bits(g.scale.data<float>()[0]), bits(from_hex(s)));
      EXPECT_EQ(bits(g.scale_inv.data<float>()[0]), bits(from_hex(si)));
    }
    ++n;
  }
  EXPECT_EQ(n, 18);
}

// fp8_gemm = s * (A B^T): the products of FP8 values are exact in f32 and f64, so the CPU's f32
// sums differ from the f64 reference by at most gamma_K sum_k |a_k b_k| (K u / (1 - K u), u =
// 2^-24), scaled by s, plus the final rounding to f32 (u |ref|), 2 u |c| more with beta = 1.
TEST(Fp8Gemm, CpuWithinTheF32AccumulationBound) {
  const auto& ops = test::ops_on("cpu");
  const int64_t m = 32, n = 48, k = 64;
  for (auto [ta, tb] :
       {std::pair{DType::fp8_e4m3, DType::fp8_e4m3}, std::pair{DType::fp8_e5m2, DType::fp8_e4m3},
        std::pair{DType::fp8_e4m3, DType::fp8_e5m2}}) {
    for (float beta : {0.0f, 1.0f}) {
      const auto av = test::random_values(static_cast<std::size_t>(m * k), 11, -300.0, 300.0);
      const auto bv = test::random_values(static_cast<std::size_t>(n * k), 12, -30.0, 30.0);
      const Tensor a = Tensor::from_vector(av, {m, k}, ta);
      const Tensor b = Tensor::from_vector(bv, {n, k}, tb);
      const Tensor sa = Tensor::from_vector(std::vector<float>{0.37f}, {1});
      const Tensor sb = Tensor::from_vector(std::vector<float>{1.0f / 448.0f}, {1});
      const auto c0 = test::random_values(static_cast<std::size_t>(m * n), 13, -1.0, 1.0);
      Tensor c = Tensor::from_vector(c0, {m, n}, DType::f32);
      ops.fp8_gemm(c, a, b, sa, sb, ops::Fp8GemmArgs{.beta = beta});
      const auto ad = a.to(DType::f64).to_vector<double>(),
                 bd = b.to(DType::f64).to_vector<double>();
      const auto cv = c.to_vector<float>();
      const double s = static_cast<double>(0.37f * (1.0f / 448.0f)), u = std::ldexp(1.0, -24);
      const double gamma = k * u / (1 - k * u);
      int bad = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0, abs_sum = 0;
          for (int64_t p = 0; p < k; ++p) {
            ref += ad[i * k + p] * bd[j * k + p];
            abs_sum += std::fabs(ad[i * k + p] * bd[j * k + p]);
          }
          const double c_old = static_cast<float>(c0[i * n + j]);
          ref = s * ref + beta * c_old;
          const double bound = s * gamma * abs_sum + u * std::fabs(ref) +
                               2 * u * beta * std::fabs(c_old) +
                               u * s * abs_sum;  // s itself is rounded to f32 once
          bad += std::fabs(cv[i * n + j] - ref) > bound;
        }
      EXPECT_EQ(bad, 0) << dtype_name(ta) << " x " << dtype_name(tb) << " beta " << beta;
    }
  }
}

TEST(Fp8Gemm, RefusesBadShapesAndDtypes) {
  const auto& ops = test::ops_on("cpu");
  const Tensor s = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  Tensor c = Tensor::zeros({16, 16}, DType::f32);
  const Tensor e4 = Tensor::zeros({16, 24}, DType::fp8_e4m3);
  EXPECT_THROW(ops.fp8_gemm(c, e4, e4, s, s, {}), Error);  // K = 24 not a multiple of 16
  const Tensor e5 = Tensor::zeros({16, 16}, DType::fp8_e5m2);
  EXPECT_THROW(ops.fp8_gemm(c, e5, e5, s, s, {}), Error);  // e5m2 x e5m2
  const Tensor bf = Tensor::zeros({16, 16}, DType::bf16);
  EXPECT_THROW(ops.fp8_gemm(c, bf, bf, s, s, {}), Error);  // not FP8
}

// An FP8 C (Fp8GemmArgs::out_scale, --fp8-multi-head-attention's dO): the bytes and amax of
// fp8_cast_transpose applied to the f32 C the same GEMM writes -- one rounding of the f32 result,
// saturating (out_scale large enough that some outputs pass fp8_max), the amax of the unscaled
// result accumulated into out_amax (a larger earlier amax kept).
TEST(Fp8Gemm, Fp8OutputIsTheCastOfTheF32Result) {
  const auto& ops = test::ops_on("cpu");
  const int64_t m = 32, n = 48, k = 64;
  const auto av = test::random_values(static_cast<std::size_t>(m * k), 21, -300.0, 300.0);
  const auto bv = test::random_values(static_cast<std::size_t>(n * k), 22, -30.0, 30.0);
  const Tensor a = Tensor::from_vector(av, {m, k}, DType::fp8_e5m2);
  const Tensor b = Tensor::from_vector(bv, {n, k}, DType::fp8_e4m3);
  const Tensor sa = Tensor::from_vector(std::vector<float>{0.37f}, {1});
  const Tensor sb = Tensor::from_vector(std::vector<float>{1.0f / 448.0f}, {1});
  Tensor c32 = Tensor::zeros({m, n}, DType::f32);
  ops.fp8_gemm(c32, a, b, sa, sb, {});
  float max_abs = 0.0f;
  for (float v : c32.to_vector<float>()) max_abs = std::max(max_abs, std::fabs(v));
  for (DType out : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    // Half the largest |output| lands on fp8_max: the top quarter or so saturates.
    const Tensor scale =
        Tensor::from_vector(std::vector<float>{2.0f * fp8::fp8_max(out) / max_abs}, {1});
    for (float earlier : {0.0f, 4.0f * max_abs}) {
      Tensor want_q = Tensor::zeros({m, n}, out), none;
      Tensor want_amax = Tensor::from_vector(std::vector<float>{earlier}, {1});
      ops.fp8_cast_transpose(want_q, none, want_amax, c32, scale);
      Tensor q = Tensor::zeros({m, n}, out);
      Tensor amax = Tensor::from_vector(std::vector<float>{earlier}, {1});
      ops.fp8_gemm(q, a, b, sa, sb, ops::Fp8GemmArgs{.out_scale = scale, .out_amax = amax});
      EXPECT_EQ(bytes_of(q), bytes_of(want_q)) << dtype_name(out);
      EXPECT_EQ(amax.to_vector<float>(), want_amax.to_vector<float>()) << dtype_name(out);
      EXPECT_EQ(amax.to_vector<float>()[0], std::max(earlier, max_abs));
    }
    int saturated = 0;
    Tensor q = Tensor::zeros({m, n}, out);
    ops.fp8_gemm(q, a, b, sa, sb, ops::Fp8GemmArgs{.out_scale = scale});  // no amax: none kept
    for (double v : q.to(DType::f64).to_vector<double>())
      saturated += std::fabs(v) == static_cast<double>(fp8::fp8_max(out));
    EXPECT_GT(saturated, 0) << "the test must reach the saturation";
  }
  // Refusals: an FP8 C without its scale, or accumulated into.
  Tensor q = Tensor::zeros({m, n}, DType::fp8_e4m3);
  const Tensor one = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  EXPECT_THROW(ops.fp8_gemm(q, a, b, sa, sb, {}), Error);
  EXPECT_THROW(ops.fp8_gemm(q, a, b, sa, sb, ops::Fp8GemmArgs{.beta = 1.0f, .out_scale = one}),
               Error);
}

// fp8_transpose moves the bytes (NaN and negative-zero encodings included); refuses a shape or
// format mismatch.
TEST(Fp8Transpose, MovesTheBytes) {
  const auto& ops = test::ops_on("cpu");
  for (auto [r, c] : {std::pair<int64_t, int64_t>{48, 80}, {7, 13}, {130, 3}}) {
    std::vector<uint8_t> bytes(static_cast<std::size_t>(r * c));
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    Tensor q = Tensor::zeros({r, c}, DType::fp8_e4m3);
    std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(q.raw_data()));
    Tensor qt = Tensor::zeros({c, r}, DType::fp8_e4m3);
    ops.fp8_transpose(qt, q);
    const auto* tp = static_cast<const uint8_t*>(qt.raw_data());
    int bad = 0;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        bad += tp[j * r + i] != bytes[static_cast<std::size_t>(i * c + j)];
    EXPECT_EQ(bad, 0) << r << " x " << c;
  }
  const Tensor q = Tensor::zeros({16, 32}, DType::fp8_e4m3);
  Tensor wrong_shape = Tensor::zeros({16, 32}, DType::fp8_e4m3);
  EXPECT_THROW(ops.fp8_transpose(wrong_shape, q), Error);
  Tensor wrong_format = Tensor::zeros({32, 16}, DType::fp8_e5m2);
  EXPECT_THROW(ops.fp8_transpose(wrong_format, q), Error);
}

// The fused QKV's FP8 weight gradient (ColumnParallelLinear::backward_split): with block rows
// multiples of 16 each block's rows of main_grad take their gradient straight from the part's
// transposed FP8 gradient (fp8_gemm with beta 1), no regrouped scratch and no gather back
// (moe_permute) -- the bytes of the per-part GEMM: main_grad rows of block b equal the rows of
// fp8_gemm(gqt_p, x_q^T) that block b holds in part p, bit for bit (first pass: every scale 1).
TEST(Fp8QkvSplit, WeightGradientsGoStraightIntoTheBlocks) {
  Runtime& rt = mg::init({.platform = "cpu"});
  ops::OpProfiler prof(*rt.ops, *rt.platform, rt.device);
  transformer::TransformerConfig cfg;
  cfg.num_layers = 1;
  cfg.fp8.format = fp8::Fp8Format::hybrid;
  cfg.fp8.recipe = fp8::Fp8Recipe::delayed;
  Fp8State st(cfg.fp8, prof.table(), Device::cpu());
  transformer::ModuleContext ctx;
  ctx.ops = &prof.table();
  ctx.config = &cfg;
  ctx.device = Device::cpu();
  ctx.fp8 = &st;
  ctx.fp8_training = true;
  // Two KV groups of [q: 32 rows | k: 16 | v: 16] (two query heads of 16 per group).
  const int64_t in = 32, s = 16, b = 2, n = s * b;
  tensor_parallel::OutputSplit split;
  split.part_rows = {64, 32, 32};
  for (int64_t g = 0; g < 2; ++g) {
    split.blocks.push_back({0, g * 64, 32});
    split.blocks.push_back({1, g * 64 + 32, 16});
    split.blocks.push_back({2, g * 64 + 48, 16});
  }
  transformer::ParamBuilder pb(ctx);
  tensor_parallel::ColumnParallelLinear l(ctx, pb, "decoder.layers.0.self_attention.linear_qkv.",
                                          tensor_parallel::ColumnParallelLinearConfig{
                                              .input_size = in, .output_size = 128, .bias = false});
  st.finalize();
  std::vector<transformer::Parameter> params;
  transformer::ParamAndGradBuffer buf;
  std::vector<transformer::ParamDecl> decls;
  pb.finish(params, buf, decls);
  const auto wv = test::random_values(static_cast<std::size_t>(128 * in), 5, -0.5, 0.5);
  l.weight().value.copy_(Tensor::from_vector(wv, {128, in}, DType::f32));
  ctx.ops->fill(buf.grads, 0.0);
  const Tensor x = Tensor::from_vector(
      test::random_values(static_cast<std::size_t>(n * in), 6, -2.0, 2.0), {s, b, in}, DType::f32);
  tensor_parallel::ColumnParallelLinear::Saved saved;
  const std::vector<Tensor> parts = l.forward_split(x, saved, split);
  std::vector<Tensor> dparts;
  for (std::size_t p = 0; p < 3; ++p)
    dparts.push_back(Tensor::from_vector(
        test::random_values(static_cast<std::size_t>(n * split.part_rows[p]), 7 + p, -3.0, 3.0),
        {n, split.part_rows[p]}, DType::f32));
  prof.start();
  prof.begin_step();
  (void)l.backward_split(dparts, x, saved, split);
  prof.end_step();
  prof.stop();
  const ops::OpProfileRow* permute = prof.report().find("moe_permute");
  EXPECT_TRUE(permute == nullptr || permute->calls == 0) << "the gradients were gathered back";
  // The reference: the casts at scale 1 and one FP8 GEMM per part.
  const auto& ops = test::ops_on("cpu");
  const Tensor one = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  Tensor amax = Tensor::zeros({1}, DType::f32), none;
  Tensor xt = Tensor::empty({in, n}, DType::fp8_e4m3);
  ops.fp8_cast_transpose(none, xt, amax, x.view({n, in}), one);
  const std::vector<float> grad = l.weight().grad.to_vector<float>();
  std::vector<int64_t> filled(3, 0);
  std::vector<std::vector<float>> ref(3);
  for (std::size_t p = 0; p < 3; ++p) {
    Tensor gqt = Tensor::empty({split.part_rows[p], n}, DType::fp8_e5m2);
    ops.fp8_cast_transpose(none, gqt, amax, dparts[p], one);
    Tensor dw = Tensor::zeros({split.part_rows[p], in}, DType::f32);
    ops.fp8_gemm(dw, gqt, xt, one, one, {});
    ref[p] = dw.to_vector<float>();
  }
  int bad = 0;
  for (const auto& blk : split.blocks) {
    const auto p = static_cast<std::size_t>(blk.part);
    for (int64_t r = 0; r < blk.rows; ++r)
      for (int64_t c = 0; c < in; ++c)
        bad += bits(grad[static_cast<std::size_t>((blk.offset + r) * in + c)]) !=
               bits(ref[p][static_cast<std::size_t>((filled[p] + r) * in + c)]);
    filled[p] += blk.rows;
  }
  EXPECT_EQ(bad, 0);
  float max_abs = 0.0f;
  for (float g : grad) max_abs = std::max(max_abs, std::fabs(g));
  EXPECT_GT(max_abs, 1.0f);  // real gradients, not zeros
}

TEST(Fp8ScaleUpdate, OpEqualsTheReference) {
  const auto& ops = test::ops_on("cpu");
  const float special[] = {0.0f, std::nanf(""), INFINITY, 1e-30f, 3.0e38f, 448.0f, 0.02f};
  for (bool current : {false, true})
    for (int64_t len : {int64_t{1}, int64_t{2}, int64_t{5}})
      for (bool max_history : {false, true})
        for (int64_t margin : {int64_t{0}, int64_t{2}}) {
          if (current && (len != 1 || margin != 0)) continue;
          const int64_t slots = 9;
          auto h = test::random_values(static_cast<std::size_t>(len * slots), 31, 0.0, 50.0);
          std::vector<float> hist(h.begin(), h.end());
          for (std::size_t i = 0; i < 7; ++i) hist[i] = special[i];
          std::vector<float> sc(static_cast<std::size_t>(slots), 0.5f), si(sc.size(), 2.0f);
          Tensor th = Tensor::from_vector(hist, {len, slots}),
                 ts = Tensor::from_vector(sc, {slots}), tsi = Tensor::from_vector(si, {slots});
          const float fmax = 57344.0f;
          ops.fp8_scale_update(th, ts, tsi,
                               ops::Fp8ScaleUpdateArgs{.fp8_max = fmax,
                                                       .margin = margin,
                                                       .max_history = max_history,
                                                       .current = current});
          if (current) {
            for (int64_t j = 0; j < slots; ++j) {
              const float want = fp8::current_scale(hist[static_cast<std::size_t>(j)], fmax);
              EXPECT_EQ(bits(ts.data<float>()[j]), bits(want)) << "slot " << j;
              EXPECT_EQ(bits(tsi.data<float>()[j]), bits(1.0f / want)) << "slot " << j;
            }
            const auto gh = th.to_vector<float>();  // current scaling leaves the amaxes
            for (std::size_t i = 0; i < hist.size(); ++i) EXPECT_EQ(bits(gh[i]), bits(hist[i]));
            continue;
          }
          fp8::delayed_update(
              hist, sc, si, len, slots, fmax, margin,
              max_history ? fp8::AmaxComputeAlgo::max : fp8::AmaxComputeAlgo::most_recent);
          const auto gh = th.to_vector<float>(), gs = ts.to_vector<float>(),
                     gsi = tsi.to_vector<float>();
          for (std::size_t i = 0; i < hist.size(); ++i)
            EXPECT_EQ(bits(gh[i]), bits(hist[i])) << "len " << len << " h" << i;
          for (std::size_t i = 0; i < sc.size(); ++i) {
            EXPECT_EQ(bits(gs[i]), bits(sc[i])) << "len " << len << " slot " << i;
            EXPECT_EQ(bits(gsi[i]), bits(si[i])) << "len " << len << " slot " << i;
          }
        }
  Tensor h = Tensor::zeros({2, 3}, DType::f32), s = Tensor::zeros({2}, DType::f32),
         si = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW(ops.fp8_scale_update(h, s, si, {}), Error);
  Tensor s3 = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW(ops.fp8_scale_update(h, s3, si, {.current = true}), Error);  // current: [1, S]
}

// A 2-layer LLaMA whose linears all run in FP8 (sizes multiples of 16).
transformer::TransformerConfig fp8_llama(fp8::Fp8Recipe recipe, int64_t history, bool cache) {
  transformer::TransformerConfig c = test::tiny_llama_config();
  c.hidden_size = 32;
  c.ffn_hidden_size = 64;
  c.seq_length = 16;
  c.fp8.format = fp8::Fp8Format::hybrid;
  c.fp8.recipe = recipe;
  c.fp8.amax_history_len = history;
  c.fp8.disable_parameter_transpose_cache = !cache;
  return c;
}

using test::FbRun;
using test::run_fb;

void expect_same(const FbRun& a, const FbRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << " micro-batch " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_EQ(a.grads[i], b.grads[i]) << what << " gradient " << i;
}

TEST(Fp8WeightCache, TensorwiseCastsOncePerCallWithTheSameNumbers) {
  const FbRun cached = run_fb(fp8_llama(fp8::Fp8Recipe::tensorwise, 1, true), 3, 2, false);
  const FbRun every = run_fb(fp8_llama(fp8::Fp8Recipe::tensorwise, 1, false), 3, 2, false);
  ASSERT_EQ(cached.linears, 8);  // qkv, proj, fc1, fc2 of 2 layers
  EXPECT_EQ(cached.casts, cached.linears);
  EXPECT_EQ(every.casts, 3 * every.linears);
  expect_same(cached, every, "tensorwise, 3 micro-batches");
}

TEST(Fp8WeightCache, DelayedOneMicroBatchSameNumbers) {
  for (int64_t len : {int64_t{1}, int64_t{4}}) {
    const FbRun cached = run_fb(fp8_llama(fp8::Fp8Recipe::delayed, len, true), 1, 3, false);
    const FbRun every = run_fb(fp8_llama(fp8::Fp8Recipe::delayed, len, false), 1, 3, false);
    EXPECT_EQ(cached.casts, cached.linears);
    EXPECT_EQ(every.casts, every.linears);
    expect_same(cached, every, "delayed, history " + std::to_string(len));
    EXPECT_EQ(cached.fwd_history, every.fwd_history);
  }
}

TEST(Fp8WeightCache, DelayedLaterMicroBatchesRecordNoWeightAmax) {
  // History 4, one call of 3 micro-batches: 3 forward updates. Each roll moves row 0 (the pass's
  // amaxes) to the last row, so after them rows 1..3 hold the passes' amaxes (row 1 the first
  // pass's). Inputs (even columns) record in every pass; the cached weights (odd columns) only in
  // the first, casting in every micro-batch records them 3 times.
  const FbRun cached = run_fb(fp8_llama(fp8::Fp8Recipe::delayed, 4, true), 3, 1, false);
  const FbRun every = run_fb(fp8_llama(fp8::Fp8Recipe::delayed, 4, false), 3, 1, false);
  EXPECT_EQ(cached.casts, cached.linears);
  EXPECT_EQ(every.casts, 3 * every.linears);
  const int64_t slots = 2 * cached.linears;
  auto at = [&](const FbRun& r, int64_t row, int64_t col) {
    return r.fwd_history[static_cast<std::size_t>(row * slots + col)];
  };
  for (int64_t col = 0; col < slots; ++col) {
    int recorded = 0, recorded_every = 0;
    for (int64_t row = 1; row < 4; ++row) {
      recorded += at(cached, row, col) > 0.0f;
      recorded_every += at(every, row, col) > 0.0f;
    }
    EXPECT_EQ(recorded, col % 2 == 0 ? 3 : 1) << "column " << col;
    EXPECT_EQ(recorded_every, 3) << "column " << col;
    if (col % 2 == 1) {
      EXPECT_EQ(at(cached, 1, col), at(every, 1, col)) << "column " << col;
    }
  }
  // The first micro-batch casts with the same scales either way.
  EXPECT_EQ(cached.losses[0], every.losses[0]);
}

TEST(Fp8WeightCache, EvaluationCastsEveryMicroBatch) {
  const FbRun eval = run_fb(fp8_llama(fp8::Fp8Recipe::delayed, 1, true), 2, 1, true);
  EXPECT_EQ(eval.casts, 2 * eval.linears);
  for (float h : eval.fwd_history) EXPECT_EQ(h, 0.0f);  // evaluation records nothing
}

// ---- SwiGLU fused into the FP8 casts ----------------------------------------------------------

// Two forward-backward calls under the op profiler.
FbRun run_fb_profiled(const transformer::TransformerConfig& c, int64_t micro) {
  return test::run_fb_profiled(c, micro, 2, false);
}

TEST(Fp8FusedSwiglu, SameNumbersAsTheSeparateOps) {
  for (const fp8::Fp8Recipe recipe : {fp8::Fp8Recipe::delayed, fp8::Fp8Recipe::tensorwise}) {
    const std::string what =
        recipe == fp8::Fp8Recipe::delayed ? "delayed, history 4" : "tensorwise";
    transformer::TransformerConfig c = fp8_llama(recipe, 4, true);
    ASSERT_TRUE(c.bias_swiglu_fusion) << "Megatron's default: fused";
    ASSERT_FALSE(c.add_bias_linear);
    const FbRun fused = run_fb_profiled(c, 3);
    c.bias_swiglu_fusion = false;
    const FbRun split = run_fb_profiled(c, 3);
    expect_same(fused, split, what);
    EXPECT_EQ(fused.fwd_history, split.fwd_history) << what;
    EXPECT_EQ(fused.bwd_history, split.bwd_history) << what;
    // 2 layers x 3 micro-batches x 2 calls; tensorwise takes the operand's amax first (one more
    // fused call per cast).
    const int64_t casts = 2 * 3 * 2, per_cast = recipe == fp8::Fp8Recipe::delayed ? 1 : 2;
    EXPECT_EQ(fused.calls("fp8_swiglu_cast_transpose"), casts * per_cast) << what;
    EXPECT_EQ(fused.calls("fp8_dswiglu_cast_transpose"), casts * per_cast) << what;
    EXPECT_EQ(fused.calls("swiglu_fwd"), 0) << what;
    EXPECT_EQ(fused.calls("swiglu_bwd"), 0) << what;
    EXPECT_EQ(split.calls("swiglu_fwd"), casts) << what;
    EXPECT_EQ(split.calls("swiglu_bwd"), casts) << what;
    EXPECT_EQ(split.calls("fp8_swiglu_cast_transpose") + split.calls("fp8_dswiglu_cast_transpose"),
              0)
        << what;
  }
}

// ---- the norms in the FP8 casts (Fp8Config::norm_cast_fusion) ----------------------------------

// input_layernorm inside linear_qkv's cast and pre_mlp_layernorm (with the attention's
// bias-dropout-add) inside linear_fc1's: the same losses, gradients and amax histories as the norm
// ops followed by the casts, for RMSNorm (LLaMA) and LayerNorm with biases (GPT-2 without the
// bias-GELU fusion), both recipes; the fused function runs (twice per cast under tensorwise: its
// amax pass first) and the layers' norm ops do not (the final norm is no linear's input).
TEST(Fp8FusedNorm, SameNumbersAsTheNormOpsAndCasts) {
  for (const bool llama : {true, false}) {
    for (const fp8::Fp8Recipe recipe : {fp8::Fp8Recipe::delayed, fp8::Fp8Recipe::tensorwise}) {
      std::string what = llama ? "llama (RMSNorm), " : "gpt (LayerNorm, biases), ";
      what += recipe == fp8::Fp8Recipe::delayed ? "delayed" : "tensorwise";
      transformer::TransformerConfig c = fp8_llama(recipe, 4, true);
      if (!llama) {
        c = test::tiny_gpt2_config();
        c.hidden_size = 32;
        c.ffn_hidden_size = 128;
        c.seq_length = 16;
        c.max_position_embeddings = 16;
        c.bias_activation_fusion = false;  // fc1 through forward(): its norm fuses too
        c.fp8.format = fp8::Fp8Format::hybrid;
        c.fp8.recipe = recipe;
        c.fp8.amax_history_len = 4;
      }
      ASSERT_TRUE(c.fp8.norm_cast_fusion) << "the default: fused";
      const FbRun fused = run_fb_profiled(c, 3);
      c.fp8.norm_cast_fusion = false;
      const FbRun split = run_fb_profiled(c, 3);
      expect_same(fused, split, what);
      EXPECT_EQ(fused.fwd_history, split.fwd_history) << what;
      EXPECT_EQ(fused.bwd_history, split.bwd_history) << what;
      const int64_t passes = 3 * 2, per_cast = recipe == fp8::Fp8Recipe::delayed ? 1 : 2;
      EXPECT_EQ(fused.calls("fp8_norm_cast_transpose"), 2 * 2 * passes * per_cast) << what;
      EXPECT_EQ(split.calls("fp8_norm_cast_transpose"), 0) << what;
      const char* norm_op = llama ? "rmsnorm_fwd" : "layernorm_fwd";
      EXPECT_EQ(fused.calls(norm_op), passes) << what << ": only the final norm";
      EXPECT_EQ(split.calls(norm_op), 3 * passes) << what;
      EXPECT_EQ(fused.calls("bias_dropout_add_norm_fwd"), 0) << what;
      EXPECT_EQ(split.calls("bias_dropout_add_norm_fwd"), 2 * passes) << what;
    }
  }
}

// Where the linear cannot take it the norm runs as before: --no-fp8-wgrad (the weight gradient
// reads the written norm output), the layers --first-last-layers-bf16 keeps out of FP8.
TEST(Fp8FusedNorm, KeptApartWhereTheLinearNeedsTheNormOutput) {
  transformer::TransformerConfig c = fp8_llama(fp8::Fp8Recipe::delayed, 1, true);
  c.fp8.wgrad = false;
  const FbRun hp = run_fb_profiled(c, 1);
  EXPECT_EQ(hp.calls("fp8_norm_cast_transpose"), 0);
  c = fp8_llama(fp8::Fp8Recipe::delayed, 1, true);
  c.fp8.first_last_layers_bf16 = true;
  c.fp8.num_layers_at_start_in_bf16 = 1;
  c.fp8.num_layers_at_end_in_bf16 = 0;
  const FbRun half = run_fb_profiled(c, 1);
  EXPECT_EQ(half.calls("fp8_norm_cast_transpose"), 2 * 2);  // layer 1's two norms, 2 calls
  EXPECT_EQ(half.calls("rmsnorm_fwd"), 2 * 2);              // layer 0's first and the final one
}

// The function itself: the bytes and amax of the norm op then fp8_cast_transpose, the statistics
// and sum as the norm op writes them (the CPU runs the generic pair; this pins its contract), and
// bad arguments refused.
TEST(Fp8FusedNorm, FunctionEqualsTheNormOpThenTheCast) {
  const auto& ops = test::ops_on("cpu");
  const int64_t r = 48, h = 64;
  const Tensor x = Tensor::from_vector(
      test::random_values(static_cast<std::size_t>(r * h), 31, -3.0, 3.0), {r, h}, DType::bf16);
  const Tensor res = Tensor::from_vector(
      test::random_values(static_cast<std::size_t>(r * h), 32, -3.0, 3.0), {r, h}, DType::bf16);
  const Tensor g = Tensor::from_vector(test::random_values(h, 33, 0.5, 1.5), {h}, DType::bf16);
  const Tensor b = Tensor::from_vector(test::random_values(h, 34, -0.5, 0.5), {h}, DType::bf16);
  const Tensor scale = Tensor::from_vector(std::vector<float>{37.0f}, {1});
  for (const bool ln : {true, false}) {
    for (const bool bda : {false, true}) {
      const ops::NormKind kind = ln ? ops::NormKind::layernorm : ops::NormKind::rmsnorm;
      const ops::NormArgs args{.eps = 1e-5f};
      Tensor y = Tensor::empty({r, h}, DType::bf16), sum_ref, mean_ref, rstd_ref;
      rstd_ref = Tensor::empty({r}, DType::f32);
      if (ln) mean_ref = Tensor::empty({r}, DType::f32);
      if (bda) {
        sum_ref = Tensor::empty({r, h}, DType::bf16);
        ops.bias_dropout_add_norm_fwd(y, sum_ref, mean_ref, rstd_ref, x, b, res, g,
                                      ln ? b : Tensor(), ops::DropoutArgs{}, args, kind);
      } else if (ln) {
        ops.layernorm_fwd(y, mean_ref, rstd_ref, x, g, b, args);
      } else {
        ops.rmsnorm_fwd(y, rstd_ref, x, g, args);
      }
      Tensor q_ref = Tensor::empty({r, h}, DType::fp8_e4m3),
             qt_ref = Tensor::empty({h, r}, DType::fp8_e4m3);
      Tensor amax_ref = Tensor::from_vector(std::vector<float>{0.5f}, {1});
      ops.fp8_cast_transpose(q_ref, qt_ref, amax_ref, y, scale);
      Tensor q = Tensor::empty({r, h}, DType::fp8_e4m3),
             qt = Tensor::empty({h, r}, DType::fp8_e4m3);
      Tensor amax = Tensor::from_vector(std::vector<float>{0.5f}, {1});
      Tensor sum = bda ? Tensor::empty({r, h}, DType::bf16) : Tensor();
      Tensor mean = ln ? Tensor::empty({r}, DType::f32) : Tensor(),
             rstd = Tensor::empty({r}, DType::f32);
      ops.fp8_norm_cast_transpose(q, qt, amax, sum, mean, rstd, x, bda ? b : Tensor(),
                                  bda ? res : Tensor(), g, ln ? b : Tensor(), scale,
                                  ops::DropoutArgs{}, args, kind);
      const std::string what = std::string(ln ? "layernorm" : "rmsnorm") + (bda ? " + bda" : "");
      EXPECT_EQ(bytes_of(q), bytes_of(q_ref)) << what;
      EXPECT_EQ(bytes_of(qt), bytes_of(qt_ref)) << what;
      EXPECT_EQ(amax.to_vector<float>(), amax_ref.to_vector<float>()) << what;
      EXPECT_EQ(rstd.to_vector<float>(), rstd_ref.to_vector<float>()) << what;
      if (ln) {
        EXPECT_EQ(mean.to_vector<float>(), mean_ref.to_vector<float>()) << what;
      }
      if (bda) {
        EXPECT_EQ(bytes_of(sum), bytes_of(sum_ref)) << what;
      }
    }
  }
  // A sum aliasing the residual (the function may run twice), a bias without a residual.
  Tensor q = Tensor::empty({r, h}, DType::fp8_e4m3), none, amax = Tensor::zeros({1}, DType::f32);
  Tensor rstd = Tensor::empty({r}, DType::f32), mean;
  Tensor alias = res;
  EXPECT_THROW(
      ops.fp8_norm_cast_transpose(q, none, amax, alias, mean, rstd, x, b, res, g, Tensor(), scale,
                                  ops::DropoutArgs{}, ops::NormArgs{}, ops::NormKind::rmsnorm),
      Error);
  Tensor no_sum;
  EXPECT_THROW(ops.fp8_norm_cast_transpose(q, none, amax, no_sum, mean, rstd, x, b, Tensor(), g,
                                           Tensor(), scale, ops::DropoutArgs{}, ops::NormArgs{},
                                           ops::NormKind::rmsnorm),
               Error);
}

TEST(Fp8FusedSwiglu, HighPrecisionWeightGradientsKeepTheSeparateOps) {
  // --no-fp8-wgrad: the weight gradients read the written activation and output gradient.
  transformer::TransformerConfig c = fp8_llama(fp8::Fp8Recipe::delayed, 1, true);
  c.fp8.wgrad = false;
  const FbRun r = run_fb_profiled(c, 1);
  EXPECT_EQ(r.calls("fp8_swiglu_cast_transpose") + r.calls("fp8_dswiglu_cast_transpose"), 0);
  EXPECT_EQ(r.calls("swiglu_fwd"), 2 * 2);
  EXPECT_EQ(r.calls("swiglu_bwd"), 2 * 2);
}

// The functions' contract on the CPU table: the same q, qt and amax as the separate ops (there
// the generic composition of those ops, so this part guards a CPU provider that would replace it;
// the CUDA kernels are checked the same way in cuda_fp8_test) and refusals of bad shapes and
// dtypes, which the validation does whatever the provider.
TEST(Fp8FusedSwiglu, OpsEqualTheSeparateOpsAndRefuseBadShapes) {
  const auto& ops = test::ops_on("cpu");
  const int64_t rows = 6, f = 5;  // no multiple of 8 needed on the CPU
  for (const DType t : {DType::bf16, DType::f32})
    for (const DType qd : {DType::fp8_e4m3, DType::fp8_e5m2}) {
      const Tensor x =
          Tensor::from_vector(test::random_values(rows * 2 * f, 7, 0.01, 6.0), {rows, 2 * f}).to(t);
      const Tensor dy =
          Tensor::from_vector(test::random_values(rows * f, 8, 0.01, 3.0), {rows, f}).to(t);
      const Tensor scale = Tensor::from_vector(std::vector<float>{20.0f}, {1});
      // Separate ops.
      Tensor y = Tensor::empty({rows, f}, t), dx = Tensor::empty({rows, 2 * f}, t);
      ops.swiglu_fwd(y, x);
      ops.swiglu_bwd(dx, dy, x);
      Tensor q1 = Tensor::empty({rows, f}, qd), qt1 = Tensor::empty({f, rows}, qd);
      Tensor g1 = Tensor::empty({rows, 2 * f}, qd), gt1 = Tensor::empty({2 * f, rows}, qd);
      Tensor a1 = Tensor::zeros({1}, DType::f32), b1 = Tensor::zeros({1}, DType::f32);
      ops.fp8_cast_transpose(q1, qt1, a1, y, scale);
      ops.fp8_cast_transpose(g1, gt1, b1, dx, scale);
      // Fused.
      Tensor q2 = Tensor::empty({rows, f}, qd), qt2 = Tensor::empty({f, rows}, qd);
      Tensor g2 = Tensor::empty({rows, 2 * f}, qd), gt2 = Tensor::empty({2 * f, rows}, qd);
      Tensor a2 = Tensor::zeros({1}, DType::f32), b2 = Tensor::zeros({1}, DType::f32);
      ops.fp8_swiglu_cast_transpose(q2, qt2, a2, x, scale);
      ops.fp8_dswiglu_cast_transpose(g2, gt2, b2, dy, x, scale);
      EXPECT_EQ(bytes_of(q1), bytes_of(q2));
      EXPECT_EQ(bytes_of(qt1), bytes_of(qt2));
      EXPECT_EQ(bytes_of(g1), bytes_of(g2));
      EXPECT_EQ(bytes_of(gt1), bytes_of(gt2));
      EXPECT_GT(a1.to_vector<float>()[0], 0.0f);
      EXPECT_EQ(a1.to_vector<float>(), a2.to_vector<float>());
      EXPECT_EQ(b1.to_vector<float>(), b2.to_vector<float>());
    }
  const Tensor scale = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  Tensor amax = Tensor::zeros({1}, DType::f32), none, none2;
  Tensor odd = Tensor::zeros({4, 7}, DType::bf16);
  EXPECT_THROW(ops.fp8_swiglu_cast_transpose(none, none2, amax, odd, scale), Error);
  Tensor x = Tensor::zeros({4, 8}, DType::bf16), dy_bad = Tensor::zeros({4, 8}, DType::bf16);
  EXPECT_THROW(ops.fp8_dswiglu_cast_transpose(none, none2, amax, dy_bad, x, scale), Error);
  Tensor q_bad = Tensor::empty({4, 8}, DType::fp8_e4m3);  // the operand is [4, 4]
  EXPECT_THROW(ops.fp8_swiglu_cast_transpose(q_bad, none2, amax, x, scale), Error);
  Tensor x64 = Tensor::zeros({4, 8}, DType::f64);
  EXPECT_THROW(ops.fp8_swiglu_cast_transpose(none, none2, amax, x64, scale), Error);
}

}  // namespace
}  // namespace mg
