// Helpers for the MegatronOptimizer tests: a tiny "model" of hand-made Parameters over flat buffers
// (Megatron names, reverse layout with gaps, decay and no-decay params), gradient setters, and a
// naive f64 reference of Adam(W) / SGD as Megatron configures them.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "megatron/core/optimizer/optimizer.h"
#include "tests/unit/test_util.h"

namespace mg::test::opt {

using transformer::ParamAndGradBuffer;
using transformer::Parameter;

struct ParamSpec {
  std::string name;
  Shape shape;
  bool no_weight_decay;
};

inline const std::vector<ParamSpec>& specs() {
  static const std::vector<ParamSpec> s = {
      {"output_layer.weight", {2, 5}, false},
      {"decoder.final_layernorm.weight", {4}, true},
      {"decoder.layers.0.mlp.linear_fc1.bias", {3}, true},
      {"decoder.layers.0.mlp.linear_fc1.weight", {3, 4}, false},
  };
  return s;
}

struct TestModel {
  std::vector<Parameter> params;
  ParamAndGradBuffer buffer;
};

// Parameters laid out with a one-element gap between them (offset arithmetic must be right),
// initial values random in [0.1, 1] with random signs, grads zero.
inline TestModel make_model(DType param_dtype, DType grad_dtype, Device dev, uint64_t seed = 7) {
  TestModel m;
  int64_t total = 1;
  std::vector<int64_t> offsets;
  for (const auto& s : specs()) {
    offsets.push_back(total);
    total += shape_numel(s.shape) + 1;
  }
  m.buffer.params = Tensor::empty({total}, param_dtype, dev);
  m.buffer.params.copy_(
      Tensor::from_vector(random_values(static_cast<std::size_t>(total), seed), {total}));
  m.buffer.grads = Tensor::zeros({total}, grad_dtype, dev);
  for (std::size_t i = 0; i < specs().size(); ++i) {
    const auto& s = specs()[i];
    Parameter p;
    p.name = s.name;
    p.param = m.buffer.params.slice(offsets[i], shape_numel(s.shape)).view(s.shape);
    p.main_grad = m.buffer.grads.slice(offsets[i], shape_numel(s.shape)).view(s.shape);
    p.no_weight_decay = s.no_weight_decay;
    p.global_shape = s.shape;
    p.buffer_offset = offsets[i];
    m.params.push_back(p);
  }
  return m;
}

// Per-parameter gradient values for one step (deterministic from seed, f32-representable), times
// `scale`.
inline std::vector<std::vector<double>> make_grads(uint64_t seed, double scale = 1.0) {
  std::vector<std::vector<double>> g;
  for (const auto& s : specs()) {
    auto v = random_values(static_cast<std::size_t>(shape_numel(s.shape)), seed++, 0.05, 2.0);
    for (double& x : v) x = static_cast<float>(x) * scale;  // what an f32 main_grad holds
    g.push_back(v);
  }
  return g;
}

inline void set_grads(TestModel& m, const std::vector<std::vector<double>>& g) {
  for (std::size_t i = 0; i < m.params.size(); ++i)
    m.params[i].main_grad.copy_(Tensor::from_vector(g[i], m.params[i].param.shape()));
}

inline std::vector<std::vector<double>> values_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const auto& t : ts) out.push_back(t.to_vector<double>());
  return out;
}

inline std::vector<std::vector<double>> model_values(const TestModel& m) {
  std::vector<Tensor> ts;
  for (const auto& p : m.params) ts.push_back(p.param);
  return values_of(ts);
}

inline std::vector<std::vector<double>> master_values(const optimizer::MegatronOptimizer& o,
                                                      std::size_t n) {
  std::vector<Tensor> ts;
  for (std::size_t i = 0; i < n; ++i) ts.push_back(o.master_param(i));
  return values_of(ts);
}

// Naive f64 reference: Megatron's step order (clip by the global norm, then the update) with
// apex FusedAdam (AdamW, bias correction) or torch SGD; decay only where !no_weight_decay.
struct Reference {
  std::vector<std::vector<double>> p, m, v, buf;
  int64_t step = 0;
  double clip_grad = 0.0;

  explicit Reference(std::vector<std::vector<double>> init) : p(std::move(init)) {
    for (const auto& x : p) {
      m.emplace_back(x.size(), 0.0);
      v.emplace_back(x.size(), 0.0);
      buf.emplace_back(x.size(), 0.0);
    }
  }
  // Returns the pre-clip norm; g is clipped in place.
  double clip(std::vector<std::vector<double>>& g) const {
    double sq = 0;
    for (const auto& x : g)
      for (double e : x) sq += e * e;
    const double norm = std::sqrt(sq);
    const double coeff = clip_grad / (norm + 1e-6);
    if (clip_grad > 0 && coeff < 1.0)
      for (auto& x : g)
        for (double& e : x) e *= coeff;
    return norm;
  }
  double adam(std::vector<std::vector<double>> g, double lr, double wd, double b1, double b2,
              double eps) {
    const double norm = clip(g);
    ++step;
    const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double w = specs()[i].no_weight_decay ? 0.0 : wd;
      for (std::size_t e = 0; e < p[i].size(); ++e) {
        m[i][e] = b1 * m[i][e] + (1 - b1) * g[i][e];
        v[i][e] = b2 * v[i][e] + (1 - b2) * g[i][e] * g[i][e];
        const double upd = (m[i][e] / bc1) / (std::sqrt(v[i][e] / bc2) + eps) + w * p[i][e];
        p[i][e] -= lr * upd;
      }
    }
    return norm;
  }
  double sgd(std::vector<std::vector<double>> g, double lr, double wd, double momentum) {
    const double norm = clip(g);
    ++step;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double w = specs()[i].no_weight_decay ? 0.0 : wd;
      for (std::size_t e = 0; e < p[i].size(); ++e) {
        double d = g[i][e] + w * p[i][e];
        if (momentum != 0) {
          buf[i][e] = step == 1 ? d : momentum * buf[i][e] + d;
          d = buf[i][e];
        }
        p[i][e] -= lr * d;
      }
    }
    return norm;
  }
};

inline ::testing::AssertionResult all_close2(const std::vector<std::vector<double>>& a,
                                             const std::vector<std::vector<double>>& e, Tol tol) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto r = all_close(a[i], e[i], tol);
    if (!r) return r << " (parameter " << specs()[i].name << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace mg::test::opt
