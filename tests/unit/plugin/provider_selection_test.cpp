// Provider selection through the registry (ggml's supports_op): a provider with a supports
// predicate serves the calls it accepts and the next resolved provider the others, per call; a
// preferred provider (ResolveOptions::providers, MG_OP_PROVIDERS' syntax) runs first and an
// opt-in one (Priority::alternative) runs only when preferred; a deterministic run never resolves
// a non-deterministic provider; unknown slots or providers are errors listing the valid ones; and
// the resolution table names what runs. Fake providers of `fill` on the CPU platform, so every
// case runs without a device.
#include <algorithm>
#include <string>

#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::ops::OpId;
using mg::plugin::Priority;
using mg::plugin::Registry;
using mg::plugin::ResolveOptions;

// Each fake fills with its own value, so the values say which provider ran.
void fill_with(mg::Tensor& x, double v) {
  mg::convert_host(x.raw_data(), x.dtype(), std::vector<double>(x.numel(), v).data(), DType::f64,
                   x.numel());
}
void fill_general(mg::Tensor& x, double) {
  fill_with(x, 1.0);
}
void fill_special(mg::Tensor& x, double) {
  fill_with(x, 2.0);
}
void fill_racy(mg::Tensor& x, double) {
  fill_with(x, 3.0);
}
bool f32_only(mg::Tensor& x, double) {
  return x.dtype() == DType::f32;
}

// The value `table.fill` writes into a fresh tensor of `dtype`.
double filled_by(const mg::ops::OpTable& table, DType dtype) {
  mg::Tensor t = mg::Tensor::empty({2}, dtype);
  table.fill(t, 0.0);
  return t.to_vector<double>().front();
}

mg::plugin::Resolution fill_resolution(const Registry& r, const ResolveOptions& o = {}) {
  return r.resolutions("cpu", o)[static_cast<int>(OpId::fill)];
}

TEST(ProviderSelection, SupportsPredicateFallsBackPerCall) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_general, "general");
  r.register_op<OpId::fill>("cpu", &fill_special, "special", Priority::plugin,
                            {.supports = &f32_only});
  const auto res = fill_resolution(r);
  EXPECT_EQ(res.provider, "special");
  EXPECT_TRUE(res.supports_predicate);
  ASSERT_EQ(res.fallbacks, std::vector<std::string>{"general"});
  EXPECT_TRUE(res.shadowed.empty());
  EXPECT_EQ(mg::plugin::describe(res), "special (else general)");
  const auto& t = r.ops("cpu");
  EXPECT_EQ(filled_by(t, DType::f32), 2.0);  // served by special
  EXPECT_EQ(filled_by(t, DType::f64), 1.0);  // not supported: the fallback
  EXPECT_EQ(filled_by(t, DType::bf16), 1.0);
}

TEST(ProviderSelection, AlternativeRunsOnlyWhenPreferred) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_special, "cpu:alt", Priority::alternative,
                            {.supports = &f32_only});
  r.register_op<OpId::fill>("cpu", &fill_general, "cpu:default");
  // Default: the platform's provider, the alternative shadowed, a direct call.
  auto res = fill_resolution(r);
  EXPECT_EQ(res.provider, "cpu:default");
  EXPECT_FALSE(res.preferred);
  EXPECT_TRUE(res.fallbacks.empty());
  EXPECT_EQ(res.shadowed, std::vector<std::string>{"cpu:alt"});
  const auto& plain = r.ops("cpu");
  EXPECT_EQ(filled_by(plain, DType::f32), 1.0);
  // Preferred: runs first where it supports the call, the default elsewhere.
  ResolveOptions prefer;
  prefer.providers = mg::plugin::parse_op_providers("fill=cpu:alt", "test");
  res = fill_resolution(r, prefer);
  EXPECT_EQ(res.provider, "cpu:alt");
  EXPECT_TRUE(res.preferred);
  EXPECT_EQ(res.fallbacks, std::vector<std::string>{"cpu:default"});
  EXPECT_TRUE(res.shadowed.empty());
  const auto& preferred = r.ops("cpu", prefer);
  EXPECT_NE(&preferred, &plain);                 // a table per set of options, both cached
  EXPECT_EQ(&preferred, &r.ops("cpu", prefer));  // and resolved once
  EXPECT_EQ(filled_by(preferred, DType::f32), 2.0);
  EXPECT_EQ(filled_by(preferred, DType::f64), 1.0);
  EXPECT_EQ(filled_by(plain, DType::f32), 1.0);  // the other run's table is unaffected
  // Preferring the provider that wins anyway is allowed and changes nothing but the flag.
  ResolveOptions same;
  same.providers = {{"fill", "cpu:default"}};
  res = fill_resolution(r, same);
  EXPECT_EQ(res.provider, "cpu:default");
  EXPECT_TRUE(res.preferred);
  EXPECT_EQ(filled_by(r.ops("cpu", same), DType::f32), 1.0);
}

TEST(ProviderSelection, PreferenceOfAProviderWithoutPredicateEndsTheChain) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_general, "rows");
  r.register_op<OpId::fill>("cpu", &fill_special, "tiled", Priority::platform,
                            {.supports = &f32_only});
  EXPECT_EQ(mg::plugin::describe(fill_resolution(r)), "tiled (else rows)");
  ResolveOptions o;
  o.providers = {{"fill", "rows"}};
  const auto res = fill_resolution(r, o);
  EXPECT_EQ(res.provider, "rows");
  EXPECT_TRUE(res.fallbacks.empty());
  EXPECT_EQ(res.shadowed, std::vector<std::string>{"tiled"});
  EXPECT_EQ(filled_by(r.ops("cpu", o), DType::f32), 1.0);
}

TEST(ProviderSelection, NoProviderSupportingTheCallIsAClearError) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_special, "picky", Priority::platform,
                            {.supports = &f32_only});
  const auto res = fill_resolution(r);
  EXPECT_EQ(mg::plugin::describe(res), "picky (only the calls it supports)");
  const auto& t = r.ops("cpu");
  EXPECT_EQ(filled_by(t, DType::f32), 2.0);
  const std::string msg = mg::test::error_message([&] { filled_by(t, DType::f64); });
  EXPECT_NE(msg.find("op 'fill' on platform 'cpu': no resolved provider supports this call"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("tried picky"), std::string::npos) << msg;
}

TEST(ProviderSelection, DeterministicRunNeverResolvesANonDeterministicProvider) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_general, "exact");
  r.register_op<OpId::fill>("cpu", &fill_racy, "racy", Priority::plugin, {.deterministic = false});
  EXPECT_EQ(fill_resolution(r).provider, "racy");
  ResolveOptions det;
  det.deterministic = true;
  const auto res = fill_resolution(r, det);
  EXPECT_EQ(res.provider, "exact");
  EXPECT_EQ(res.excluded, std::vector<std::string>{"racy"});
  EXPECT_TRUE(res.shadowed.empty());
  // Two runs in one process, each with its own table.
  EXPECT_EQ(filled_by(r.ops("cpu", det), DType::f32), 1.0);
  EXPECT_EQ(filled_by(r.ops("cpu"), DType::f32), 3.0);
  // Preferring the racy one in a deterministic run is refused.
  det.providers = {{"fill", "racy"}};
  const std::string msg = mg::test::error_message([&] { r.ops("cpu", det); });
  EXPECT_NE(msg.find("'racy' is not deterministic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--deterministic-mode"), std::string::npos) << msg;
}

TEST(ProviderSelection, UnknownSlotOrProviderListsTheValidOnes) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_general, "one");
  r.register_op<OpId::fill>(mg::plugin::kGenericPlatform, &fill_special, "generic:two",
                            Priority::generic);
  ResolveOptions o;
  o.providers = {{"fil", "one"}};
  std::string msg = mg::test::error_message([&] { r.ops("cpu", o); });
  EXPECT_NE(msg.find("'fil' is not an op slot"), std::string::npos) << msg;
  EXPECT_NE(msg.find("attention_fwd"), std::string::npos) << msg;  // the list of slots
  o.providers = {{"fill", "three"}};
  msg = mg::test::error_message([&] { r.resolutions("cpu", o); });
  EXPECT_NE(msg.find("'fill=three'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("slot 'fill' has no provider 'three' on platform 'cpu'; its providers: "
                     "one, generic:two"),
            std::string::npos)
      << msg;
  // A provider of another platform is not one of this platform's.
  r.register_op<OpId::fill>("cuda", &fill_racy, "cuda:fill");
  o.providers = {{"fill", "cuda:fill"}};
  msg = mg::test::error_message([&] { r.ops("cpu", o); });
  EXPECT_NE(msg.find("has no provider 'cuda:fill' on platform 'cpu'"), std::string::npos) << msg;
  // A generic provider can be preferred.
  o.providers = {{"fill", "generic:two"}};
  EXPECT_EQ(filled_by(r.ops("cpu", o), DType::f32), 2.0);
  EXPECT_EQ(fill_resolution(r, o).shadowed, std::vector<std::string>{"one"});
}

TEST(ProviderSelection, ParseOpProviders) {
  using mg::plugin::parse_op_providers;
  const auto m = parse_op_providers(
      " attention_fwd=cuda:attention-mma, attention_bwd = cuda:attention-rows,", "MG_OP_PROVIDERS");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("attention_fwd"), "cuda:attention-mma");
  EXPECT_EQ(m.at("attention_bwd"), "cuda:attention-rows");
  EXPECT_TRUE(parse_op_providers("", "MG_OP_PROVIDERS").empty());
  for (const char* bad : {"attention_fwd", "=x", "attention_fwd="}) {
    const std::string msg =
        mg::test::error_message([&] { parse_op_providers(bad, "MG_OP_PROVIDERS"); });
    EXPECT_NE(msg.find("MG_OP_PROVIDERS: entry '"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("is not slot=provider"), std::string::npos) << msg;
  }
  const std::string msg = mg::test::error_message([] { parse_op_providers("fill=a,fill=b", "x"); });
  EXPECT_NE(msg.find("slot 'fill' is named twice ('a' and 'b')"), std::string::npos) << msg;
}

TEST(ProviderSelection, ResolveOptionsKey) {
  ResolveOptions o;
  EXPECT_EQ(o.str(), "");
  o.deterministic = true;
  EXPECT_EQ(o.str(), "deterministic");
  o.providers = {{"fill", "a"}, {"axpy", "b"}};
  EXPECT_EQ(o.str(), "deterministic;axpy=b,fill=a");
}

// The built-in registration: on the CUDA platform (when built) attention has the tiled kernel with
// the row kernels as its fallback, and the tensor-core forward only as an opt-in.
TEST(ProviderSelection, BuiltinCudaAttentionProviders) {
  Registry r;
  mg::register_builtin(r);
  if (!r.find_platform("cuda")) GTEST_SKIP() << "this build has no CUDA platform (MG_CUDA=OFF)";
  const auto fwd = r.resolutions("cuda")[static_cast<int>(OpId::attention_fwd)];
  EXPECT_EQ(mg::plugin::describe(fwd), "cuda:attention-tiled (else cuda:attention-rows)");
  // The opt-in alternatives: the tensor-core forward, and cuDNN's in a build that found it.
  EXPECT_NE(std::find(fwd.shadowed.begin(), fwd.shadowed.end(), "cuda:attention-mma"),
            fwd.shadowed.end());
  for (const auto& p : fwd.shadowed)
    EXPECT_TRUE(p == "cuda:attention-mma" || p == "cuda:cudnn") << p;
  const auto bwd = r.resolutions("cuda")[static_cast<int>(OpId::attention_bwd)];
  EXPECT_EQ(mg::plugin::describe(bwd), "cuda:attention-tiled (else cuda:attention-rows)");
  ResolveOptions mma;
  mma.providers = {{"attention_fwd", "cuda:attention-mma"}};
  const auto pref = r.resolutions("cuda", mma)[static_cast<int>(OpId::attention_fwd)];
  EXPECT_EQ(mg::plugin::describe(pref),
            "cuda:attention-mma (else cuda:attention-tiled, cuda:attention-rows)");
  EXPECT_TRUE(pref.preferred);
  // Resolving (without a GPU: the table is only built, never called) works for both.
  EXPECT_NE(&r.ops("cuda", mma), &r.ops("cuda"));
}

}  // namespace
