// FP8 quantisation and Transformer Engine's scaling recipes against an independent reference:
// tests/fixtures/fp8/fp8_fixture.txt (gen_fp8_fixture.py: ml_dtypes casts, numpy f32 recipe).
//   - fp8_cast_transpose on the CPU: q and qt bit for bit, amax exactly, for E4M3 and E5M2 at
//     several scales (saturation, subnormals, round-to-nearest-even ties).
//   - Delayed scaling through Fp8State: amaxes recorded by real casts into history row 0, then
//     update(): the history (roll, row 0 zeroed), scale and scale_inv bit for bit after every
//     step, for history lengths 1..16, both amax algorithms, margins 0..2; forward (input and
//     weight) and backward (gradient) slots; the state survives state_json / load_state_json.
//   - Tensorwise (current) scaling: current_scale and Fp8State::scaling's scale / scale_inv.
//   - fp8_gemm on the CPU against an f64 reference within the derived f32 accumulation bound.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/dtype_math.h"
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

}  // namespace
}  // namespace mg
