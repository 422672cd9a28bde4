// Tensor- and sequence-parallel layers on the world as the TP group, against the single-rank
// computation of the same layers (run in every process on a one-member group, full weights).
// tests/CMakeLists.txt runs it under mpirun -np 2 and 4 (label mpi); alone it is a one-rank unit
// test. f64 throughout, so "equal" means equal to f64 round-off (the row-parallel partial sums add
// in another order). Checked (PITFALLS.md):
//   - forward values, input gradients and every parameter gradient (gathered) equal the
//     single-rank ones for Column/RowParallelLinear (SP on and off, gather_output and
//     !input_is_parallel), VocabParallelEmbedding and the vocab-parallel output + cross entropy on
//     a vocabulary that TP does not divide (#1, #2);
//   - SP on equals SP off;
//   - TP-replicated parameters have bit-identical gradients on every TP rank (#3);
//   - the gathered initial weights equal the full single-rank init bit for bit (#7);
//   - a whole TransformerLayer (GPT-2: LayerNorm, GELU, biases; LLaMA/Qwen3-like: RMSNorm, SwiGLU,
//     RoPE, GQA, qk-layernorm, qkv bias) with TP, with and without SP and hidden dropout, equals
//     the single-rank layer.
//   - on one rank: OutputSplit (the fused QKV) and the bias-GELU fusion equal the plain layer and
//     the separate ops.
// Every rank runs the same collectives whatever a check gives (EXPECT_*, never ASSERT_*).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/tensor_parallel/cross_entropy.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/tensor_parallel/sharding.h"
#include "megatron/core/transformer/transformer_layer.h"
#include "tests/unit/core/tensor_parallel/tp_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::tensor_parallel {
namespace {

using namespace std::chrono_literals;
using test::det_tensor;
using transformer::Parameter;

comm::Communicator& communicator() {
  static std::unique_ptr<comm::Communicator> c = [] {
    auto p = comm::init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}
comm::ProcessGroup& tp_group() {
  return *communicator().world();
}

std::vector<double> vec(const Tensor& t) {
  return t.to_vector<double>();
}

// The parameters and buffers of a few layers built on one group (f64).
struct Net {
  transformer::TransformerConfig cfg;
  transformer::ModuleContext ctx;
  std::unique_ptr<transformer::ParamBuilder> pb;
  std::vector<Parameter> params;
  transformer::ParamAndGradBuffer buf;
  std::vector<transformer::ParamDecl> decls;
  Net() {
    test::ensure_runtime();
    ctx.ops = &test::ops_on("cpu");
    ctx.config = &cfg;
    ctx.dtype = ctx.grad_dtype = DType::f64;
    pb = std::make_unique<transformer::ParamBuilder>(ctx);
  }
  // Every parameter (biases too, so they matter) normal(0, 0.5) from its name's seed, each shard
  // drawn from the full tensor's counters.
  void finish() {
    pb->finish(params, buf, decls);
    for (std::size_t i = 0; i < params.size(); ++i) {
      ops::InitArgs a;
      a.std = 0.5;
      a.seed = transformer::init_seed(1234, params[i].name);
      init_normal_partitioned(*ctx.ops, params[i].param, params[i].global_shape, decls[i].partition,
                              a);
    }
  }
  const Parameter& param(const std::string& name) const {
    for (const auto& p : params)
      if (p.name == name) return p;
    MG_THROW("no parameter " << name);
  }
};

// Gathered parameter (value or grad) of the TP net; checks TP-replicated grads are identical on
// every rank (#3).
Tensor gathered(const Net& net, const std::string& name, bool grad) {
  comm::ProcessGroup& g = tp_group();
  for (std::size_t i = 0; i < net.params.size(); ++i) {
    const Parameter& p = net.params[i];
    if (p.name != name) continue;
    const Tensor t = grad ? p.main_grad : p.param;
    if (net.decls[i].partition.replicated()) {
      Tensor all = all_gather_dim0(t.view({1, t.numel()}), g);
      for (int r = 1; r < g.size(); ++r)
        EXPECT_EQ(vec(all.select(r)), vec(all.select(0)))
            << name << (grad ? " grad" : " value") << " differs between TP ranks 0 and " << r;
      return t;
    }
    return gather_partitioned(t, p.global_shape, net.decls[i].partition, g);
  }
  MG_THROW("no parameter " << name);
}

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  EXPECT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_TRUE(test::all_close(vec(actual), vec(expected), test::tolerance(DType::f64))) << what;
}

// Every parameter of `tp` gathered: initial values bit-identical to `ref` (#7), grads close.
void expect_params_match(const Net& tp, const Net& ref, bool grads) {
  for (const Parameter& p : ref.params) {
    if (grads) {
      expect_close(gathered(tp, p.name, true), p.main_grad, p.name + " grad");
    } else {
      EXPECT_EQ(vec(gathered(tp, p.name, false)), vec(p.param)) << p.name << " initial value";
    }
  }
}

struct LinearCase {
  bool sequence_parallel;
  bool gather_output;  // column gathers its output; the row layer then splits its input
  int stride;          // column partition_stride; 2: SwiGLU's [gate; up] fc1, then the swiglu op
};

// Column (H -> F, or H -> 2F then SwiGLU) then Row (F -> H): an MLP (linear when stride 1).
void run_linear_case(const LinearCase& c) {
  comm::ProcessGroup& g = tp_group();
  test::SoloGroup solo;
  const int64_t s = 8, b = 2, h = 6, f = 16;
  auto build = [&](Net& net, comm::ProcessGroup& grp, bool sp) {
    net.ctx.tp_group = &grp;
    net.ctx.sequence_parallel = sp;
    auto col = std::make_unique<ColumnParallelLinear>(
        net.ctx, *net.pb, "fc1.",
        ColumnParallelLinearConfig{.input_size = h,
                                   .output_size = c.stride * f,
                                   .gather_output = c.gather_output,
                                   .partition_stride = c.stride});
    auto row = std::make_unique<RowParallelLinear>(
        net.ctx, *net.pb, "fc2.",
        RowParallelLinearConfig{
            .input_size = f, .output_size = h, .input_is_parallel = !c.gather_output});
    net.finish();
    return std::make_pair(std::move(col), std::move(row));
  };
  Net ref, tp;
  auto [rcol, rrow] = build(ref, solo, false);
  auto [tcol, trow] = build(tp, g, c.sequence_parallel);
  expect_params_match(tp, ref, false);

  const Tensor x = det_tensor({s, b, h}, 11), dy = det_tensor({s, b, h}, 12);
  const ops::OpTable& ops = *ref.ctx.ops;
  // The activation between the layers: identity, or SwiGLU on the [gate_r | up_r] columns.
  auto act = [&](const Tensor& u) {
    if (c.stride == 1) return u;
    Tensor a = Tensor::empty({u.numel() / u.size(-1), u.size(-1) / 2}, DType::f64);
    ops.swiglu_fwd(a, u.view({a.size(0), -1}));
    Shape sh = u.shape();
    sh.back() /= 2;
    return a.view(sh);
  };
  auto act_bwd = [&](const Tensor& da, const Tensor& u) {
    if (c.stride == 1) return da;
    Tensor du = Tensor::empty(u.shape(), DType::f64);
    Tensor du2 = du.view({da.numel() / da.size(-1), -1});
    ops.swiglu_bwd(du2, da.view({du2.size(0), -1}), u.view({du2.size(0), -1}));
    return du;
  };
  auto run = [&](ColumnParallelLinear& col, RowParallelLinear& row, const Tensor& xin,
                 const Tensor& dyin, Tensor& dxout) {
    ColumnParallelLinear::Saved cs;
    const Tensor u = col.forward(xin, cs);
    const Tensor a = act(u);
    const Tensor y = row.forward(a);
    dxout = col.backward(act_bwd(row.backward(dyin, a), u), xin, cs);
    return y;
  };
  Tensor dx_ref;
  const Tensor y_ref = run(*rcol, *rrow, x, dy, dx_ref);

  const bool sp = c.sequence_parallel;
  Tensor dx;
  Tensor y = run(*tcol, *trow, sp ? split_dim0(x, g) : x, sp ? split_dim0(dy, g) : dy, dx);
  if (sp) {
    EXPECT_EQ(y.size(0), s / g.size());
    y = all_gather_dim0(y, g);
    dx = all_gather_dim0(dx, g);
    all_reduce_sequence_parallel_grads(tp.params, g);
  }
  expect_close(y, y_ref, "output");
  expect_close(dx, dx_ref, "input grad");
  expect_params_match(tp, ref, true);
}

TEST(TensorParallelLayers, ColumnThenRow) {
  run_linear_case({false, false, 1});
}
TEST(TensorParallelLayers, ColumnThenRowSequenceParallel) {
  run_linear_case({true, false, 1});
}
TEST(TensorParallelLayers, ColumnStride2ThenRowSequenceParallel) {
  run_linear_case({true, false, 2});
}
TEST(TensorParallelLayers, GatherOutputThenSplitInput) {
  run_linear_case({false, true, 1});
}

// SP on and off give the same output, input gradient and parameter gradients on every rank.
TEST(TensorParallelLayers, SequenceParallelOnEqualsOff) {
  comm::ProcessGroup& g = tp_group();
  const int64_t s = 8, b = 2, h = 6, f = 8;
  auto run = [&](bool sp, std::vector<double>& grads) {
    Net net;
    net.ctx.tp_group = &g;
    net.ctx.sequence_parallel = sp;
    ColumnParallelLinear col(net.ctx, *net.pb, "fc1.", {.input_size = h, .output_size = f});
    RowParallelLinear row(net.ctx, *net.pb, "fc2.", {.input_size = f, .output_size = h});
    net.finish();
    const Tensor x = det_tensor({s, b, h}, 21), dy = det_tensor({s, b, h}, 22);
    const Tensor xin = sp ? split_dim0(x, g) : x;
    ColumnParallelLinear::Saved cs;
    const Tensor u = col.forward(xin, cs);
    Tensor y = row.forward(u);
    Tensor dx = col.backward(row.backward(sp ? split_dim0(dy, g) : dy, u), xin, cs);
    if (sp) {
      y = all_gather_dim0(y, g);
      dx = all_gather_dim0(dx, g);
      all_reduce_sequence_parallel_grads(net.params, g);
    }
    grads = vec(net.buf.grads);
    return std::make_pair(vec(y), vec(dx));
  };
  std::vector<double> g_off, g_on;
  const auto off = run(false, g_off);
  const auto on = run(true, g_on);
  const test::Tol tol = test::tolerance(DType::f64);
  EXPECT_TRUE(test::all_close(on.first, off.first, tol));
  EXPECT_TRUE(test::all_close(on.second, off.second, tol));
  EXPECT_TRUE(test::all_close(g_on, g_off, tol));
}

// forward_split / backward_split (the fused QKV of grouped-query attention) equal the unsplit
// layer with its output columns regrouped: two groups of [q q | k | v] rows become parts q, k, v.
TEST(TensorParallelLayers, OutputSplitEqualsTheUnsplitLayer) {
  test::SoloGroup solo;
  const int64_t s = 4, b = 2, h = 6, n = s * b;
  OutputSplit split;
  split.part_rows = {4, 2, 2};
  for (int64_t g = 0; g < 2; ++g) {
    split.blocks.push_back({0, g * 4, 2});
    split.blocks.push_back({1, g * 4 + 2, 1});
    split.blocks.push_back({2, g * 4 + 3, 1});
  }
  auto build = [&](Net& net) {
    net.ctx.tp_group = &solo;
    auto l = std::make_unique<ColumnParallelLinear>(
        net.ctx, *net.pb, "qkv.", ColumnParallelLinearConfig{.input_size = h, .output_size = 8});
    net.finish();
    return l;
  };
  Net ref, sp;
  auto rl = build(ref);
  auto sl = build(sp);
  const Tensor x = det_tensor({s, b, h}, 61);
  ColumnParallelLinear::Saved rs, ss;
  const std::vector<double> y = vec(rl->forward(x, rs));  // [N, 8]
  const std::vector<Tensor> parts = sl->forward_split(x, ss, split);
  // Column of row `row` of the unsplit output for each part's columns, block by block.
  std::vector<std::vector<int64_t>> cols(3);
  for (const auto& blk : split.blocks)
    for (int64_t r = 0; r < blk.rows; ++r) cols[blk.part].push_back(blk.offset + r);
  std::vector<Tensor> dparts;
  std::vector<double> dy(static_cast<std::size_t>(n * 8));
  for (int p = 0; p < 3; ++p) {
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c : cols[p]) want.push_back(y[i * 8 + c]);
    expect_close(parts[p], Tensor::from_vector(want, parts[p].shape()),
                 "part " + std::to_string(p));
    const Tensor d = det_tensor({n, split.part_rows[p]}, 70 + p);
    const std::vector<double> dv = vec(d);
    for (int64_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < cols[p].size(); ++j)
        dy[i * 8 + cols[p][j]] = dv[i * cols[p].size() + j];
    dparts.push_back(d);
  }
  const Tensor dx_ref = rl->backward(Tensor::from_vector(dy, {s, b, 8}), x, rs);
  const Tensor dx = sl->backward_split(dparts, x, ss, split);
  expect_close(dx, dx_ref, "input grad");
  expect_close(sp.buf.grads, ref.buf.grads, "weight and bias grads");
}

// Megatron's bias-GELU fusion (forward_bias_gelu, backward_dgelu_bgrad) equals the separate ops:
// bias add, tanh GELU, its backward, bias_grad.
TEST(TensorParallelLayers, BiasGeluFusionEqualsTheSeparateOps) {
  test::SoloGroup solo;
  const int64_t s = 4, b = 2, h = 6, f = 8;
  auto build = [&](Net& net, bool fused) {
    net.ctx.tp_group = &solo;
    auto fc1 = std::make_unique<ColumnParallelLinear>(
        net.ctx, *net.pb, "fc1.",
        ColumnParallelLinearConfig{.input_size = h, .output_size = f, .gemm_bias_fusion = fused});
    auto fc2 = std::make_unique<RowParallelLinear>(
        net.ctx, *net.pb, "fc2.",
        RowParallelLinearConfig{.input_size = f, .output_size = h, .skip_bias_add = true});
    net.finish();
    return std::make_pair(std::move(fc1), std::move(fc2));
  };
  Net fn, sn;
  auto [ffc1, ffc2] = build(fn, true);
  auto [sfc1, sfc2] = build(sn, false);
  const Tensor x = det_tensor({s, b, h}, 81), dy = det_tensor({s, b, h}, 82);
  const ops::OpTable& ops = *sn.ctx.ops;
  // Fused.
  ColumnParallelLinear::Saved fs;
  Tensor pre;
  const Tensor fa = ffc1->forward_bias_gelu(x, fs, pre);
  const Tensor fy = ffc2->forward(fa);
  const Tensor fdu = ffc2->backward_dgelu_bgrad(dy, fa, pre, ffc1->bias().grad);
  const Tensor fdx = ffc1->backward(fdu, x, fs, /*bias_grad_done=*/true);
  // Separate ops.
  ColumnParallelLinear::Saved ss;
  const Tensor u = sfc1->forward(x, ss).view({s * b, f});
  Tensor a = Tensor::empty(u.shape(), DType::f64);
  ops.gelu_fwd(a, u, ops::GeluApprox::tanh);
  const Tensor sy = sfc2->forward(a.view({s, b, f}));
  const Tensor da = sfc2->backward(dy, a.view({s, b, f})).view({s * b, f});
  Tensor du = Tensor::empty(u.shape(), DType::f64);
  ops.gelu_bwd(du, da, u, ops::GeluApprox::tanh);
  const Tensor sdx = sfc1->backward(du.view({s, b, f}), x, ss);
  expect_close(fy, sy, "output");
  expect_close(fdx, sdx, "input grad");
  expect_close(fn.buf.grads, sn.buf.grads, "weight and bias grads");
}

// Embedding -> output layer (column-parallel, logits never gathered) -> vocab-parallel cross
// entropy, V = 1003 padded to a multiple of TP, against the serial embedding, gemm and cross
// entropy on the same padded vocabulary.
void run_vocab_case(bool sp) {
  comm::ProcessGroup& g = tp_group();
  test::SoloGroup solo;
  const int64_t vocab = 1003, s = 8, b = 2, h = 6, n = s * b;
  transformer::TransformerConfig vc;
  vc.make_vocab_size_divisible_by = 1;
  const int64_t vpad = vc.padded_vocab_size(vocab, g.size());
  EXPECT_EQ(vpad % g.size(), 0);
  auto build = [&](Net& net, comm::ProcessGroup& grp, bool seq) {
    net.ctx.tp_group = &grp;
    net.ctx.sequence_parallel = seq;
    auto emb = std::make_unique<VocabParallelEmbedding>(
        net.ctx, *net.pb, "embedding.word_embeddings.weight", vpad, h, seq);
    auto out = std::make_unique<ColumnParallelLinear>(
        net.ctx, *net.pb, "output_layer.",
        ColumnParallelLinearConfig{.input_size = h, .output_size = vpad, .bias = false});
    net.finish();
    return std::make_pair(std::move(emb), std::move(out));
  };
  Net ref, tp;
  auto [remb, rout] = build(ref, solo, false);
  auto [temb, tout] = build(tp, g, sp);
  expect_params_match(tp, ref, false);

  std::vector<int64_t> ids(n), labels(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = (i * 337 + 5) % vocab;
    labels[i] = (i * 611 + 1002) % vocab;  // includes the last real row, 1002
  }
  const Tensor tok = Tensor::from_vector(ids, {n}), lab = Tensor::from_vector(labels, {n});
  const Tensor dloss = det_tensor({n}, 31);

  auto run = [&](Net& net, VocabParallelEmbedding& emb, ColumnParallelLinear& out,
                 comm::ProcessGroup& grp, bool seq) {
    const Tensor e = emb.forward(tok, s, b);  // [S(/TP), B, H]
    ColumnParallelLinear::Saved os;
    Tensor logits = out.forward(e, os).view({n, -1});  // [N, Vl]
    CrossEntropySaved cs;
    const Tensor loss =
        vocab_parallel_cross_entropy(*net.ctx.ops, logits, lab, emb.vocab_start(), grp, cs);
    Tensor dlogits = Tensor::empty(logits.shape(), DType::f64);
    vocab_parallel_cross_entropy_bwd(*net.ctx.ops, dlogits, dloss, logits, lab, emb.vocab_start(),
                                     cs);
    const Tensor de = out.backward(dlogits.view({s, b, -1}), e, os);
    emb.backward(de, tok);
    const Tensor e_full = seq ? all_gather_dim0(e, grp) : e;
    return std::make_pair(vec(loss), vec(e_full));
  };
  const auto r = run(ref, *remb, *rout, solo, false);
  const auto t = run(tp, *temb, *tout, g, sp);
  if (sp) all_reduce_sequence_parallel_grads(tp.params, g);
  const test::Tol tol = test::tolerance(DType::f64);
  EXPECT_TRUE(test::all_close(t.first, r.first, tol)) << "loss";
  EXPECT_TRUE(test::all_close(t.second, r.second, tol)) << "embedding output";
  expect_params_match(tp, ref, true);
}

TEST(TensorParallelLayers, VocabParallelEmbeddingOutputAndCrossEntropy) {
  run_vocab_case(false);
}
TEST(TensorParallelLayers, VocabParallelSequenceParallel) {
  run_vocab_case(true);
}

// Shards of unequal width, one possibly empty (the padding rows [V, V_pad) dropped from the output
// layer): the loss and the gradient equal serial cross entropy over the V real columns.
TEST(TensorParallelLayers, CrossEntropyOnRealRowsOnly) {
  comm::ProcessGroup& g = tp_group();
  test::ensure_runtime();
  const ops::OpTable& ops = test::ops_on("cpu");
  const int64_t vocab = 5, n = 6, vpad = 8 * g.size() / (g.size() == 1 ? 1 : 2);
  const VocabRange vr = vocab_range(vpad, g.rank(), g.size());
  const int64_t real = std::max<int64_t>(0, std::min(vr.end, vocab) - vr.start);
  const Tensor full = det_tensor({n, vocab}, 41);
  const std::vector<double> fv = vec(full);
  std::vector<double> local(static_cast<std::size_t>(n * real));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < real; ++v) local[i * real + v] = fv[i * vocab + vr.start + v];
  const Tensor logits = Tensor::from_vector(local, {n, real});
  const Tensor lab = Tensor::from_vector(std::vector<int64_t>{0, 4, 2, 3, 1, 4}, {n});
  const Tensor dloss = det_tensor({n}, 42);
  CrossEntropySaved cs;
  const Tensor loss = vocab_parallel_cross_entropy(ops, logits, lab, vr.start, g, cs, vocab);
  Tensor dl = Tensor::empty({n, real}, DType::f64);
  vocab_parallel_cross_entropy_bwd(ops, dl, dloss, logits, lab, vr.start, cs);
  // Serial reference on the full [N, V] logits.
  Tensor rl = Tensor::empty({n}, DType::f64), rm = Tensor::empty({n}, DType::f64),
         rs = Tensor::empty({n}, DType::f64), rd = Tensor::empty({n, vocab}, DType::f64);
  ops.cross_entropy_fwd(rl, rm, rs, full, lab);
  ops.cross_entropy_bwd(rd, dloss, full, rm, rs, lab, 0);
  const test::Tol tol = test::tolerance(DType::f64);
  EXPECT_TRUE(test::all_close(vec(loss), vec(rl), tol));
  const std::vector<double> rdv = vec(rd);
  std::vector<double> expect(local.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < real; ++v) expect[i * real + v] = rdv[i * vocab + vr.start + v];
  EXPECT_TRUE(test::all_close(vec(dl), expect, tol));
  // A target outside the vocabulary is refused, naming it (every rank checks: no collective).
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 5, 0, 0, 0, 0}, {n});
  if (g.size() > 1) {
    const std::string m = test::error_message(
        [&] { vocab_parallel_cross_entropy(ops, logits, bad, vr.start, g, cs, vocab); });
    EXPECT_NE(m.find("target 5 at row 1"), std::string::npos) << m;
  }
}

// A whole transformer layer on the TP group (ctx.tp_group) against the same layer on one rank.
struct LayerCase {
  bool llama;
  bool sequence_parallel;
  double hidden_dropout;
};

void run_layer_case(const LayerCase& lc) {
  comm::ProcessGroup& g = tp_group();
  transformer::TransformerConfig c;
  c.num_layers = 2;
  c.seq_length = 8;
  if (lc.llama) {
    models::apply_llama_architecture(c);
    c.hidden_size = 32;
    c.num_attention_heads = 8;
    c.num_query_groups = 4;  // GQA: 2 query heads per group, whole groups per TP rank
    c.ffn_hidden_size = 24;
    c.qk_layernorm = true;  // q/k norm grads are partial sums over TP
    c.add_qkv_bias = true;
  } else {
    models::apply_gpt2_architecture(c);
    c.hidden_size = 16;
    c.num_attention_heads = 4;
  }
  c.hidden_dropout = lc.hidden_dropout;
  c.attention_dropout = 0.0;  // TP-dependent by design (model-parallel seed per rank)
  c.params_dtype = DType::f64;
  c.finalize();
  const transformer::TransformerLayerSpec spec =
      models::get_gpt_layer_with_transformer_engine_spec(c);
  const int64_t s = 8, b = 2, h = c.hidden_size;
  auto build = [&](Net& net, bool tp) {
    net.cfg = c;
    if (tp) {
      net.ctx.tp_group = &g;
      net.ctx.sequence_parallel = lc.sequence_parallel;
    }
    auto layer = std::make_unique<transformer::TransformerLayer>(net.ctx, *net.pb, spec, 1);
    net.finish();
    return layer;
  };
  Net ref, tp;
  auto rl = build(ref, false);
  auto tl = build(tp, true);
  expect_params_match(tp, ref, false);

  transformer::AttentionInputs in;
  in.s = s;
  in.b = b;
  const transformer::DropoutCtx rng{77, 3, 1, lc.hidden_dropout > 0.0};
  const Tensor x = det_tensor({s, b, h}, 51), dy = det_tensor({s, b, h}, 52);
  transformer::TransformerLayer::Saved rs, ts;
  const Tensor y_ref = rl->forward(x, rs, in, rng, true);
  const Tensor dx_ref = rl->backward(dy, rs, in, rng);
  const bool sp = lc.sequence_parallel;
  Tensor y = tl->forward(sp ? split_dim0(x, g) : x, ts, in, rng, true);
  Tensor dx = tl->backward(sp ? split_dim0(dy, g) : dy, ts, in, rng);
  if (sp) {
    y = all_gather_dim0(y, g);
    dx = all_gather_dim0(dx, g);
  }
  all_reduce_sequence_parallel_grads(tp.params, g);  // SP norms/biases and q/k layernorm
  expect_close(y, y_ref, "layer output");
  expect_close(dx, dx_ref, "layer input grad");
  expect_params_match(tp, ref, true);
}

TEST(TensorParallelTransformerLayer, Gpt2) {
  run_layer_case({false, false, 0.0});
}
TEST(TensorParallelTransformerLayer, Gpt2SequenceParallelWithDropout) {
  run_layer_case({false, true, 0.1});
}
TEST(TensorParallelTransformerLayer, LlamaGqa) {
  run_layer_case({true, false, 0.0});
}
TEST(TensorParallelTransformerLayer, LlamaGqaSequenceParallel) {
  run_layer_case({true, true, 0.0});
}
TEST(TensorParallelTransformerLayer, LlamaGqaDropoutSequenceParallelOnAndOff) {
  run_layer_case({true, false, 0.1});
  run_layer_case({true, true, 0.1});
}

// GQA split across TP: an error naming the values when the query groups do not divide.
TEST(TensorParallelTransformerLayer, QueryGroupsNotDivisibleNamesTheValues) {
  comm::ProcessGroup& g = tp_group();
  if (g.size() == 1) GTEST_SKIP() << "needs TP > 1";
  transformer::TransformerConfig c;
  models::apply_llama_architecture(c);
  c.num_layers = 1;
  c.seq_length = 8;
  c.hidden_size = 4 * g.size() * 3;
  c.num_attention_heads = 3 * g.size();
  c.num_query_groups = 3;  // not divisible by TP 2 or 4
  c.finalize();
  Net net;
  net.cfg = c;
  net.ctx.tp_group = &g;
  const std::string m = test::error_message([&] {
    transformer::TransformerLayer l(net.ctx, *net.pb,
                                    models::get_gpt_layer_with_transformer_engine_spec(c), 0);
  });
  EXPECT_NE(m.find("num_query_groups (3)"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor_model_parallel_size (" + std::to_string(g.size()) + ")"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace mg::tensor_parallel
