// Conformance tests of the MoE dispatch index ops (moe_dispatch_index, moe_chunk_order) on every
// platform against independent references written here: the rows are the selected choices
// stably sorted by expert, each token's rows found by scanning the rows in order, every output
// compared exactly (the -1 tails and choice_counts included) over dropless, capacity-dropped,
// expert-range (the all-gather dispatch's [EP T K] choices of L = E / EP local experts), K = 1 /
// 2 / 4, tokens without a selected choice and empty inputs. End to end, the lists drive
// moe_permute / moe_unpermute to the direct weighted sum of the selected experts' outputs. The
// chunk order is checked against a sort of the received chunks, and its inverse as an inverse.
// Bad shapes are refused on every platform, bad values (read on the host) by the CPU, named. On a
// build without a GPU the cuda instances skip, printing why.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using I64s = std::vector<int64_t>;

Tensor i64(const I64s& v, Device dev) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i64).to(dev);
}

// One dispatch input: expert [N] (token-major, K per token), kept [N] (empty: all kept), the
// selected range [first, first + l), and choice_counts' shape (g 0: not asked for).
struct Input {
  std::string name;
  I64s expert{};
  std::vector<uint8_t> kept{};
  int64_t k = 1, first = 0, l = 1;
  int64_t count_first = 0, count_num = 0, g = 0, e = 0;
};

struct Lists {
  I64s counts, choice_counts, row_choice, row_token, choice_offsets, choice_rows, token_offsets,
      token_rows;
};

// The reference, built without the ops' counting sort: the selected choices sorted by (expert,
// choice); each token's rows by a scan of all rows in row order.
Lists reference(const Input& in) {
  const auto n = static_cast<int64_t>(in.expert.size());
  const int64_t tokens = n / in.k;
  auto selected = [&](int64_t i) {
    const int64_t e = in.expert[static_cast<std::size_t>(i)];
    return (in.kept.empty() || in.kept[static_cast<std::size_t>(i)] != 0) && e >= in.first &&
           e < in.first + in.l;
  };
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (expert, choice)
  for (int64_t i = 0; i < n; ++i)
    if (selected(i)) pairs.emplace_back(in.expert[static_cast<std::size_t>(i)], i);
  std::sort(pairs.begin(), pairs.end());
  const auto r = static_cast<int64_t>(pairs.size());
  Lists o;
  o.counts.assign(static_cast<std::size_t>(in.l), 0);
  for (const auto& [e, i] : pairs) ++o.counts[static_cast<std::size_t>(e - in.first)];
  o.row_choice.assign(static_cast<std::size_t>(n), -1);
  o.row_token.assign(static_cast<std::size_t>(n), -1);
  I64s row_of(static_cast<std::size_t>(n), -1);
  for (int64_t q = 0; q < r; ++q) {
    const int64_t i = pairs[static_cast<std::size_t>(q)].second;
    o.row_choice[static_cast<std::size_t>(q)] = i;
    o.row_token[static_cast<std::size_t>(q)] = i / in.k;
    row_of[static_cast<std::size_t>(i)] = q;
  }
  o.choice_offsets = {0};
  o.choice_rows.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (row_of[static_cast<std::size_t>(i)] >= 0)
      o.choice_rows.push_back(row_of[static_cast<std::size_t>(i)]);
    o.choice_offsets.push_back(static_cast<int64_t>(o.choice_rows.size()));
  }
  o.choice_rows.resize(static_cast<std::size_t>(n), -1);
  o.token_offsets = {0};
  o.token_rows.clear();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t q = 0; q < r; ++q)
      if (o.row_token[static_cast<std::size_t>(q)] == t) o.token_rows.push_back(q);
    o.token_offsets.push_back(static_cast<int64_t>(o.token_rows.size()));
  }
  o.token_rows.resize(static_cast<std::size_t>(n), -1);
  if (in.g > 0) {
    o.choice_counts.assign(static_cast<std::size_t>(in.g * in.e), 0);
    for (int64_t i = in.count_first; i < in.count_first + in.count_num; ++i) {
      const int64_t row = (i - in.count_first) / in.k % in.g;
      ++o.choice_counts[static_cast<std::size_t>(row * in.e + in.expert[static_cast<size_t>(i)])];
    }
  }
  return o;
}

// Runs the op on `platform`, every output pre-filled with 777 (so that an unwritten element
// shows).
Lists run(const ops::OpTable& ops, Device dev, const Input& in) {
  const auto n = static_cast<int64_t>(in.expert.size());
  auto filled = [&](const Shape& shape) {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    return Tensor::from_vector(I64s(static_cast<std::size_t>(numel), 777), shape, DType::i64)
        .to(dev);
  };
  Tensor counts = filled({in.l});
  Tensor choice_counts = in.g > 0 ? filled({in.g, in.e}) : Tensor();
  Tensor row_choice = filled({n}), row_token = filled({n}), choice_offsets = filled({n + 1}),
         choice_rows = filled({n}), token_offsets = filled({n / in.k + 1}),
         token_rows = filled({n});
  Tensor kept = in.kept.empty() ? Tensor() : Tensor::from_vector(in.kept, {n}, DType::u8).to(dev);
  const ops::MoeDispatchArgs args{.topk = in.k,
                                  .first_expert = in.first,
                                  .count_first = in.count_first,
                                  .count_num = in.count_num};
  ops.moe_dispatch_index(counts, choice_counts, row_choice, row_token, choice_offsets, choice_rows,
                         token_offsets, token_rows, i64(in.expert, dev), kept, args);
  Lists o;
  o.counts = counts.to_vector<int64_t>();
  if (in.g > 0) o.choice_counts = choice_counts.to_vector<int64_t>();
  o.row_choice = row_choice.to_vector<int64_t>();
  o.row_token = row_token.to_vector<int64_t>();
  o.choice_offsets = choice_offsets.to_vector<int64_t>();
  o.choice_rows = choice_rows.to_vector<int64_t>();
  o.token_offsets = token_offsets.to_vector<int64_t>();
  o.token_rows = token_rows.to_vector<int64_t>();
  return o;
}

void expect_equal(const Lists& got, const Lists& ref, const std::string& name) {
  EXPECT_EQ(got.counts, ref.counts) << name << ": counts";
  EXPECT_EQ(got.choice_counts, ref.choice_counts) << name << ": choice_counts";
  EXPECT_EQ(got.row_choice, ref.row_choice) << name << ": row_choice";
  EXPECT_EQ(got.row_token, ref.row_token) << name << ": row_token";
  EXPECT_EQ(got.choice_offsets, ref.choice_offsets) << name << ": choice_offsets";
  EXPECT_EQ(got.choice_rows, ref.choice_rows) << name << ": choice_rows";
  EXPECT_EQ(got.token_offsets, ref.token_offsets) << name << ": token_offsets";
  EXPECT_EQ(got.token_rows, ref.token_rows) << name << ": token_rows";
}

// t tokens of k experts of [0, e): distinct per token (the router's), or drawn with repeats.
I64s random_experts(int64_t t, int64_t k, int64_t e, uint64_t seed, bool distinct = true) {
  std::mt19937_64 gen(seed);
  I64s out;
  I64s all(static_cast<std::size_t>(e));
  for (int64_t x = 0; x < e; ++x) all[static_cast<std::size_t>(x)] = x;
  std::uniform_int_distribution<int64_t> pick(0, e - 1);
  for (int64_t tok = 0; tok < t; ++tok) {
    if (distinct) {
      std::shuffle(all.begin(), all.end(), gen);
      out.insert(out.end(), all.begin(), all.begin() + k);
    } else {
      for (int64_t j = 0; j < k; ++j) out.push_back(pick(gen));
    }
  }
  return out;
}

std::vector<uint8_t> random_kept(std::size_t n, double keep, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution b(keep);
  std::vector<uint8_t> out(n);
  for (auto& v : out) v = b(gen) ? 1 : 0;
  return out;
}

std::vector<Input> inputs() {
  std::vector<Input> c;
  {  // dropless, all experts, K = 2
    Input in{.name = "dropless_k2", .k = 2, .first = 0, .l = 6};
    in.expert = random_experts(7, 2, 6, 1);
    c.push_back(in);
  }
  {  // capacity-dropped, K = 4; token 1 drops every choice (no row)
    Input in{.name = "kept_k4", .k = 4, .first = 0, .l = 8};
    in.expert = random_experts(9, 4, 8, 2);
    in.kept = random_kept(in.expert.size(), 0.6, 3);
    for (int j = 0; j < 4; ++j) in.kept[4 + static_cast<std::size_t>(j)] = 0;
    c.push_back(in);
  }
  {  // K = 1, with choice_counts over every choice
    Input in{.name = "k1", .k = 1, .first = 0, .l = 4, .count_first = 0, .count_num = 11};
    in.expert = random_experts(11, 1, 4, 4);
    in.g = 1;
    in.e = 4;
    c.push_back(in);
  }
  // The all-gather dispatch: EP ranks' [T, K] choices, this rank's L = E / EP local experts
  // (first_expert = rank * L), choice_counts of this rank's own tokens only (G = 1).
  for (int64_t rank : {0, 2, 3}) {
    const int64_t ep = 4, t = 5, k = 2, e = 8, l = e / ep;
    Input in{.name = "allgather_rank" + std::to_string(rank),
             .k = k,
             .first = rank * l,
             .l = l,
             .count_first = rank * t * k,
             .count_num = t * k,
             .g = 1,
             .e = e};
    in.expert = random_experts(ep * t, k, e, 10 + static_cast<uint64_t>(rank));
    if (rank == 3) in.kept = random_kept(in.expert.size(), 0.7, 20);
    c.push_back(in);
  }
  {  // choice_counts rows G = 3 (the sequence aux loss) over a sub-range of the tokens
    Input in{.name = "choice_counts_g3",
             .k = 2,
             .first = 1,
             .l = 3,
             .count_first = 4,
             .count_num = 14,
             .g = 3,
             .e = 5};
    in.expert = random_experts(10, 2, 5, 30);
    c.push_back(in);
  }
  {  // repeated experts within a token (the op does not rely on distinct ones)
    Input in{.name = "repeats_k4", .k = 4, .first = 0, .l = 3};
    in.expert = random_experts(6, 4, 3, 40, /*distinct=*/false);
    c.push_back(in);
  }
  {  // every choice outside the range: no rows at all
    Input in{.name = "none_selected", .k = 2, .first = 6, .l = 2};
    in.expert = random_experts(4, 2, 6, 50);
    c.push_back(in);
  }
  {  // no choices
    Input in{.name = "empty",
             .k = 2,
             .first = 0,
             .l = 3,
             .count_first = 0,
             .count_num = 0,
             .g = 2,
             .e = 3};
    c.push_back(in);
  }
  {  // larger than one block of threads, many experts, a kept mask
    Input in{.name = "large", .k = 4, .first = 16, .l = 40, .count_first = 400, .count_num = 800};
    in.expert = random_experts(600, 4, 64, 60);
    in.kept = random_kept(in.expert.size(), 0.9, 61);
    in.g = 3;
    in.e = 64;
    c.push_back(in);
  }
  return c;
}

class MoeDispatchIndexTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeDispatchIndexTest, ListsEqualTheReference) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Input& in : inputs()) {
    const Lists ref = reference(in);
    expect_equal(run(ops, dev, in), ref, in.name);
    expect_equal(run(ops, dev, in), ref, in.name + " (second run)");  // deterministic
  }
}

// The reference itself, on a hand-made case: tokens 0..2 of K = 2, experts [1, 0 | 2, 1 | 0, 2],
// choice 3 dropped, range [0, 3): rows (expert, choice) = (0,1) (0,4) (1,0) (2,2) (2,5).
TEST_P(MoeDispatchIndexTest, HandMadeCase) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  Input in{.name = "hand", .k = 2, .first = 0, .l = 3, .count_first = 2, .count_num = 4};
  in.expert = {1, 0, 2, 1, 0, 2};
  in.kept = {1, 1, 1, 0, 1, 1};
  in.g = 2;
  in.e = 3;
  Lists want;
  want.counts = {2, 1, 2};
  want.choice_counts = {0, 1, 1, 1, 0, 1};  // token 1 -> row 0, token 2 -> row 1
  want.row_choice = {1, 4, 0, 2, 5, -1};
  want.row_token = {0, 2, 0, 1, 2, -1};
  want.choice_offsets = {0, 1, 2, 3, 3, 4, 5};
  want.choice_rows = {2, 0, 3, 1, 4, -1};
  want.token_offsets = {0, 2, 3, 5};
  want.token_rows = {0, 2, 3, 1, 4, -1};
  expect_equal(reference(in), want, "reference");
  expect_equal(run(test::ops_on(platform), test::device_for(platform), in), want, "op");
}

// The lists drive the token permutation: rows = x[row_token], expert e's output (e + 1) * row,
// summed back per token weighted by prob[row_choice] = sum over the selected k of prob[t, k]
// (expert[t, k] + 1) x[t].
TEST_P(MoeDispatchIndexTest, ListsDrivePermuteAndUnpermute) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t t = 6, k = 2, e = 4, h = 3, n = t * k;
  Input in{.name = "e2e", .k = k, .first = 1, .l = 2};
  in.expert = random_experts(t, k, e, 70);
  in.kept = random_kept(static_cast<std::size_t>(n), 0.75, 71);
  const Lists lists = run(ops, dev, in);
  int64_t r = 0;
  for (int64_t c : lists.counts) r += c;
  ASSERT_GT(r, 0);
  const auto x = test::random_values(static_cast<std::size_t>(t * h), 72);
  const auto prob = test::random_values(static_cast<std::size_t>(n), 73);
  Tensor xt = Tensor::from_vector(x, {t, h}, DType::f64).to(dev);
  Tensor rows = Tensor::zeros({r, h}, DType::f64, dev);
  ops.moe_permute(rows, xt, i64(lists.row_token, dev).slice(0, r));
  auto rv = rows.to_vector<double>();
  std::vector<double> p(static_cast<std::size_t>(r));
  for (int64_t q = 0; q < r; ++q) {
    const int64_t i = lists.row_choice[static_cast<std::size_t>(q)];
    p[static_cast<std::size_t>(q)] = prob[static_cast<std::size_t>(i)];
    const auto scale = static_cast<double>(in.expert[static_cast<std::size_t>(i)] + 1);
    for (int64_t j = 0; j < h; ++j) rv[static_cast<std::size_t>(q * h + j)] *= scale;
  }
  Tensor out = Tensor::zeros({t, h}, DType::f64, dev);
  ops.moe_unpermute(out, Tensor::from_vector(rv, {r, h}, DType::f64).to(dev),
                    Tensor::from_vector(p, {r}, DType::f64).to(dev), i64(lists.token_offsets, dev),
                    i64(lists.token_rows, dev).slice(0, r));
  std::vector<double> want(static_cast<std::size_t>(t * h), 0.0);
  for (int64_t tok = 0; tok < t; ++tok)
    for (int64_t j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(tok * k + j);
      const int64_t ex = in.expert[i];
      if (!in.kept[i] || ex < in.first || ex >= in.first + in.l) continue;
      for (int64_t c = 0; c < h; ++c)
        want[static_cast<std::size_t>(tok * h + c)] +=
            prob[i] * static_cast<double>(ex + 1) * x[static_cast<std::size_t>(tok * h + c)];
    }
  EXPECT_TRUE(test::all_close(out.to_vector<double>(), want, {1e-12, 1e-12}));
}

// ---- moe_chunk_order
// -----------------------------------------------------------------------------

// The received rows are chunks (j, i) in j-major order; the target lists them (i, j)-major.
void chunk_reference(const I64s& counts, int64_t ep, int64_t l, I64s& order) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> received;  // (i, j, received index)
  int64_t at = 0;
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t i = 0; i < l; ++i)
      for (int64_t x = 0; x < counts[static_cast<std::size_t>(j * l + i)]; ++x)
        received.emplace_back(i, j, at++);
  std::sort(received.begin(), received.end());
  order.clear();
  for (const auto& row : received) order.push_back(std::get<2>(row));
}

TEST_P(MoeDispatchIndexTest, ChunkOrderEqualsTheReference) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  std::mt19937_64 gen(80);
  std::uniform_int_distribution<int64_t> count(0, 4);
  for (int64_t ep : {1, 2, 4})
    for (int64_t l : {1, 3, 5, 300}) {  // 300: more chunks than the kernel's threads
      I64s counts(static_cast<std::size_t>(ep * l));
      for (auto& c : counts) c = count(gen) == 0 ? 0 : count(gen);  // many empty chunks
      if (ep == 2 && l == 3) counts.assign(counts.size(), 0);       // no rows
      I64s want;
      chunk_reference(counts, ep, l, want);
      const auto r = static_cast<int64_t>(want.size());
      Tensor order = i64(I64s(static_cast<std::size_t>(r), 777), dev);
      Tensor inverse = i64(I64s(static_cast<std::size_t>(r), 777), dev);
      ops.moe_chunk_order(order, inverse, Tensor::from_vector(counts, {ep, l}, DType::i64).to(dev));
      const auto got = order.to_vector<int64_t>();
      const auto inv = inverse.to_vector<int64_t>();
      EXPECT_EQ(got, want) << "EP " << ep << " L " << l;
      ASSERT_EQ(inv.size(), want.size());
      for (int64_t q = 0; q < r; ++q)
        EXPECT_EQ(inv[static_cast<std::size_t>(want[static_cast<std::size_t>(q)])], q)
            << "EP " << ep << " L " << l << " row " << q;
    }
}

// ---- refusals
// ------------------------------------------------------------------------------------

// Calls moe_dispatch_index with row_choice of n_out rows and counts of l_out experts (the other
// outputs sized for `in`).
void dispatch(const ops::OpTable& ops, Device dev, const Input& in, int64_t n_out, int64_t l_out) {
  Tensor counts = Tensor::zeros({l_out}, DType::i64, dev);
  Tensor choice_counts = in.g > 0 ? Tensor::zeros({in.g, in.e}, DType::i64, dev) : Tensor();
  auto vec = [&](int64_t size) { return Tensor::zeros({size}, DType::i64, dev); };
  const auto n = static_cast<int64_t>(in.expert.size());
  Tensor row_choice = vec(n_out), row_token = vec(n), choice_offsets = vec(n + 1),
         choice_rows = vec(n), token_offsets = vec(n / in.k + 1), token_rows = vec(n);
  const auto kn = static_cast<int64_t>(in.kept.size());
  Tensor kept = in.kept.empty() ? Tensor() : Tensor::from_vector(in.kept, {kn}, DType::u8).to(dev);
  const ops::MoeDispatchArgs args{.topk = in.k,
                                  .first_expert = in.first,
                                  .count_first = in.count_first,
                                  .count_num = in.count_num};
  ops.moe_dispatch_index(counts, choice_counts, row_choice, row_token, choice_offsets, choice_rows,
                         token_offsets, token_rows, i64(in.expert, dev), kept, args);
}

std::string dispatch_error(const ops::OpTable& ops, Device dev, const Input& in, int64_t n_out,
                           int64_t l_out) {
  return test::error_message([&] { dispatch(ops, dev, in, n_out, l_out); });
}

#define EXPECT_CONTAINS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)

TEST_P(MoeDispatchIndexTest, RefusesBadShapes) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  Input ok{.name = "ok", .k = 2, .first = 0, .l = 3};
  ok.expert = {0, 1, 2, 0, 1, 2};
  EXPECT_NO_THROW(dispatch(ops, dev, ok, 6, 3));
  EXPECT_CONTAINS(dispatch_error(ops, dev, ok, 5, 3), "row_choice is");
  EXPECT_CONTAINS(dispatch_error(ops, dev, ok, 6, 0), "counts is");
  Input k4 = ok;
  k4.k = 4;  // 6 choices
  EXPECT_CONTAINS(dispatch_error(ops, dev, k4, 6, 3), "topk 4 must be >= 1 and divide the 6");
  Input range = ok;
  range.count_first = 1;
  range.count_num = 2;
  range.g = 1;
  range.e = 3;
  EXPECT_CONTAINS(dispatch_error(ops, dev, range, 6, 3), "the counted choices [1, 3)");
  Input beyond = ok;
  beyond.count_first = 4;
  beyond.count_num = 4;
  beyond.g = 1;
  beyond.e = 3;
  EXPECT_CONTAINS(dispatch_error(ops, dev, beyond, 6, 3), "within the 6 choices");
  Input kept = ok;
  kept.kept = {1, 1, 1};
  EXPECT_CONTAINS(dispatch_error(ops, dev, kept, 6, 3), "kept is");
  Input first = ok;
  first.first = -1;
  EXPECT_CONTAINS(dispatch_error(ops, dev, first, 6, 3), "first_expert -1 is negative");

  auto chunk_error = [&](int64_t r, const Shape& shape) {
    return test::error_message([&] {
      Tensor order = Tensor::zeros({r}, DType::i64, dev), inverse = order.clone();
      ops.moe_chunk_order(order, inverse, Tensor::zeros(shape, DType::i64, dev));
    });
  };
  EXPECT_CONTAINS(chunk_error(0, {4}), "counts is");
  EXPECT_CONTAINS(chunk_error(0, {0, 3}), "counts is");
  const std::string msg = test::error_message([&] {
    Tensor order = Tensor::zeros({3}, DType::i64, dev),
           inverse = Tensor::zeros({2}, DType::i64, dev);
    ops.moe_chunk_order(order, inverse, Tensor::zeros({1, 1}, DType::i64, dev));
  });
  EXPECT_CONTAINS(msg, "inverse is");
}

INSTANTIATE_TEST_SUITE_P(Ops, MoeDispatchIndexTest, ::testing::ValuesIn(test::op_test_platforms()),
                         [](const auto& info) { return info.param; });

// The CPU reads the values: a negative expert, one outside choice_counts' experts in the counted
// range, negative chunk counts and counts not summing to the rows are refused, named.
TEST(MoeDispatchIndexCpu, RefusesBadValues) {
  const auto& ops = test::ops_on("cpu");
  const Device dev = Device::cpu();
  Input neg{.name = "neg", .k = 2, .first = 0, .l = 3};
  neg.expert = {0, 1, -1, 0, 1, 2};
  EXPECT_CONTAINS(dispatch_error(ops, dev, neg, 6, 3), "expert[2] = -1 is negative");
  Input wide{.name = "wide", .k = 2, .first = 0, .l = 3, .count_first = 2, .count_num = 2};
  wide.expert = {0, 7, 2, 5, 1, 2};  // 7 is outside the counted range: fine
  wide.g = 1;
  wide.e = 4;
  EXPECT_CONTAINS(dispatch_error(ops, dev, wide, 6, 3),
                  "expert[3] = 5 is outside choice_counts' 4 experts");
  wide.expert[3] = 3;
  EXPECT_NO_THROW(dispatch(ops, dev, wide, 6, 3));

  auto chunk = [&](int64_t r, const I64s& counts, int64_t ep) {
    Tensor order = Tensor::zeros({r}, DType::i64), inverse = order.clone();
    const auto l = static_cast<int64_t>(counts.size()) / ep;
    ops.moe_chunk_order(order, inverse, Tensor::from_vector(counts, {ep, l}, DType::i64));
  };
  auto chunk_error = [&](int64_t r, const I64s& counts, int64_t ep) {
    return test::error_message([&] { chunk(r, counts, ep); });
  };
  EXPECT_CONTAINS(chunk_error(6, {1, 2, 2}, 1), "the counts sum to 5 rows, order has 6");
  EXPECT_NO_THROW(chunk(5, {1, 2, 2}, 1));
  EXPECT_CONTAINS(chunk_error(1, {2, -1}, 2), "counts[1, 0] = -1 is negative");
}

}  // namespace
}  // namespace mg
