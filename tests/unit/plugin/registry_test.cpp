// Registry: priorities and ties, resolution once, late registration refused, missing slots,
// registration once per registry, duplicate providers, and platform selection (explicit name,
// MG_PLATFORM, auto order, unknown / unprovided / unavailable). Per-run options, supports
// predicates and fallbacks: provider_selection_test.cpp.
#include <cstdlib>
#include <string>

#include "megatron/platforms/cpu/cpu_platform.h"
#include "tests/unit/test_util.h"

namespace {

using mg::ops::OpId;
using mg::plugin::Priority;
using mg::plugin::Registry;

// Scoped environment variable.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

void fill_a(mg::Tensor& x, double) {
  mg::convert_host(x.raw_data(), x.dtype(), std::vector<double>(x.numel(), 1.0).data(),
                   mg::DType::f64, x.numel());
}
void fill_b(mg::Tensor& x, double) {
  mg::convert_host(x.raw_data(), x.dtype(), std::vector<double>(x.numel(), 2.0).data(),
                   mg::DType::f64, x.numel());
}
void fill_c(mg::Tensor& x, double) {
  mg::convert_host(x.raw_data(), x.dtype(), std::vector<double>(x.numel(), 3.0).data(),
                   mg::DType::f64, x.numel());
}

std::string provider_of(const Registry& r, std::string_view platform, std::string_view slot) {
  for (const auto& res : r.resolutions(platform))
    if (res.slot == slot) return res.provider;
  return "<no slot>";
}

TEST(Registry, HigherPriorityWinsAndLaterWinsTies) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_a, "a", Priority::platform);
  r.register_op<OpId::fill>("cpu", &fill_b, "b", Priority::plugin);
  r.register_op<OpId::fill>("cpu", &fill_c, "c", Priority::platform);  // lower than b
  EXPECT_EQ(provider_of(r, "cpu", "fill"), "b");
  auto res = r.resolutions("cpu");
  const auto& fill = res[static_cast<int>(OpId::fill)];
  ASSERT_EQ(fill.shadowed.size(), 2u);
  EXPECT_EQ(fill.shadowed[0], "c");  // later registration first among equals
  EXPECT_EQ(fill.shadowed[1], "a");
  mg::Tensor t = mg::Tensor::empty({3}, mg::DType::f32);
  r.ops("cpu").fill(t, 0.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(Registry, GenericImplementationIsInheritedAndOverridable) {
  Registry r;
  r.register_op<OpId::fill>(mg::plugin::kGenericPlatform, &fill_a, "generic", Priority::generic);
  EXPECT_EQ(provider_of(r, "cpu", "fill"), "generic");
  r.register_op<OpId::fill>("cuda", &fill_b, "cuda-impl", Priority::platform);
  EXPECT_EQ(provider_of(r, "cuda", "fill"), "cuda-impl");
  EXPECT_EQ(provider_of(r, "cpu", "fill"), "generic");
}

TEST(Registry, ResolutionIsCachedAndLateRegistrationRefused) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_a, "a");
  const mg::ops::OpTable& t1 = r.ops("cpu");
  const mg::ops::OpTable& t2 = r.ops("cpu");
  EXPECT_EQ(&t1, &t2);
  try {
    r.register_op<OpId::fill>("cpu", &fill_b, "late");
    FAIL() << "registration after resolution was accepted";
  } catch (const mg::Error& e) {
    EXPECT_NE(std::string(e.message()).find("after the op table of 'cpu' was resolved"),
              std::string::npos)
        << e.message();
  }
  // Other platforms can still be registered for.
  EXPECT_NO_THROW(r.register_op<OpId::fill>("cuda", &fill_b, "cuda"));
}

TEST(Registry, MissingSlotThrowsNamingTheOp) {
  Registry r;
  const auto& t = r.ops("cpu");
  mg::Tensor x = mg::Tensor::empty({2}, mg::DType::f32);
  try {
    t.fill(x, 1.0);
    FAIL() << "a missing op did not throw";
  } catch (const mg::Error& e) {
    EXPECT_NE(std::string(e.message()).find("'fill'"), std::string::npos) << e.message();
  }
  EXPECT_EQ(provider_of(r, "cpu", "fill"), "");
}

TEST(Registry, UnknownPlatformNamesAreRejected) {
  Registry r;
  EXPECT_THROW(r.register_op<OpId::fill>("rocm", &fill_a, "x"), mg::Error);
}

TEST(Registry, EveryBuiltinCpuSlotIsImplemented) {
  Registry r;
  mg::register_builtin(r);
  for (const auto& res : r.resolutions("cpu"))
    EXPECT_FALSE(res.provider.empty()) << "slot " << res.slot << " has no CPU implementation";
}

TEST(PlatformSelection, ExplicitEnvAndAuto) {
  Registry r;
  mg::register_builtin(r);
  {
    ScopedEnv env("MG_PLATFORM", nullptr);
    // Auto: the first available in cuda > musa > txda > cpu.
    const bool cuda_ok =
        r.find_platform("cuda") && r.find_platform("cuda")->availability().available;
    EXPECT_EQ(r.select_platform().name(), cuda_ok ? "cuda" : "cpu");
    EXPECT_EQ(r.select_platform("cpu").name(), "cpu");
  }
  {
    ScopedEnv env("MG_PLATFORM", "cpu");
    EXPECT_EQ(r.select_platform().name(), "cpu");
  }
}

std::string selection_error(Registry& r, const char* env_value, std::string_view requested = "") {
  ScopedEnv env("MG_PLATFORM", env_value);
  try {
    r.select_platform(requested);
  } catch (const mg::Error& e) {
    return e.message();
  }
  return "";
}

TEST(PlatformSelection, UnknownNameListsPlatforms) {
  Registry r;
  mg::register_builtin(r);
  const std::string msg = selection_error(r, "rocm");
  EXPECT_NE(msg.find("MG_PLATFORM='rocm' is not a platform name"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu: available"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
}

TEST(PlatformSelection, MusaAndTxdaNeedAPlugin) {
  Registry r;
  mg::register_builtin(r);
  for (const char* name : {"musa", "txda"}) {
    const std::string msg = selection_error(r, name);
    EXPECT_NE(msg.find("needs a plugin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MG_PLUGINS"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu: available"), std::string::npos) << msg;
  }
  // The --platform flag path names itself.
  const std::string msg = selection_error(r, nullptr, "musa");
  EXPECT_NE(msg.find("--platform='musa'"), std::string::npos) << msg;
}

TEST(PlatformSelection, UnavailablePlatformSaysWhy) {
  Registry r;
  mg::register_builtin(r);
  mg::plugin::Platform* cuda = r.find_platform("cuda");
  if (!cuda) GTEST_SKIP() << "this build has no CUDA platform (MG_CUDA=OFF)";
  const auto av = cuda->availability();
  if (av.available) GTEST_SKIP() << "a GPU is present: the unavailable path cannot be exercised";
  EXPECT_FALSE(av.reason.empty());
  const std::string msg = selection_error(r, "cuda");
  EXPECT_NE(msg.find("is unavailable: " + av.reason), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu: available"), std::string::npos) << msg;
}

TEST(PlatformSelection, DuplicatePlatformRejectedAndBuiltinsRegisteredOncePerRegistry) {
  Registry r;
  mg::register_builtin(r);
  EXPECT_NO_THROW(mg::register_builtin(r));  // once per registry: the second call is a no-op
  EXPECT_EQ(provider_of(r, "cpu", "fill"), provider_of(r, "cpu", "fill"));
  mg::plugin::Platform* cpu = r.find_platform("cpu");
  ASSERT_NE(cpu, nullptr);
  Registry other;
  mg::register_builtin(other);  // another registry gets its own registration
  EXPECT_NE(other.find_platform("cpu"), cpu);
  // Registering the same platform again directly (not through register_builtin) is refused.
  const std::string msg = mg::test::error_message([&] { mg::platforms::cpu::register_cpu(r); });
  EXPECT_NE(msg.find("platform 'cpu' is already registered"), std::string::npos) << msg;
}

TEST(Registry, RegisterOnceRunsANamedRegistrationOnce) {
  Registry r;
  static int calls = 0;
  calls = 0;
  auto fn = [](Registry& reg) {
    ++calls;
    reg.register_op<OpId::fill>("cpu", &fill_a, "once");
  };
  EXPECT_TRUE(r.register_once("mine", fn));
  EXPECT_FALSE(r.register_once("mine", fn));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(provider_of(r, "cpu", "fill"), "once");
}

TEST(Registry, DuplicateProviderNameRefused) {
  Registry r;
  r.register_op<OpId::fill>("cpu", &fill_a, "a");
  const std::string msg =
      mg::test::error_message([&] { r.register_op<OpId::fill>("cpu", &fill_b, "a"); });
  EXPECT_NE(msg.find("provider 'a' is already registered"), std::string::npos) << msg;
  EXPECT_NO_THROW(r.register_op<OpId::fill>("cuda", &fill_b, "a"));  // another platform
}

}  // namespace
