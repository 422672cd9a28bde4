// Plugin loading: the in-tree example plugin overrides an op and still computes correctly; a fake
// MUSA plugin adds a platform that selection then prefers over the CPU; broken plugins (missing
// file, no entry point, wrong API version, other op table, a path loaded twice) are refused with
// clear messages; and megatron_info shows the override and a preferred provider, and fails
// cleanly for an unprovided platform or an unknown provider.
#include <dlfcn.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "megatron/plugin/plugin_api.h"
#include "tests/unit/test_util.h"

namespace {

using mg::plugin::Registry;

std::string load_error(Registry& r, const std::string& path) {
  try {
    r.load_plugin(path);
  } catch (const mg::Error& e) {
    return e.message();
  }
  return "";
}

mg::test::CommandResult run(const std::string& cmd) {
  return mg::test::run_command(cmd);
}

TEST(Plugin, ExampleOverridesSquaredReluAndStaysCorrect) {
  Registry r;
  mg::register_builtin(r);
  const std::string builtin_provider =
      r.resolutions("cpu")[static_cast<int>(mg::ops::OpId::squared_relu_fwd)].provider;
  r.load_plugin(MG_EXAMPLE_PLUGIN_PATH);

  ASSERT_EQ(r.plugins().size(), 1u);
  EXPECT_EQ(r.plugins()[0].name, "example");
  const auto res = r.resolutions("cpu")[static_cast<int>(mg::ops::OpId::squared_relu_fwd)];
  EXPECT_EQ(res.provider, "plugin:example");
  ASSERT_EQ(res.shadowed.size(), 1u);
  EXPECT_EQ(res.shadowed[0], builtin_provider);

  // The override runs (its counter moves) and agrees with relu(x)^2 and with the built-in kernel.
  void* h = dlopen(MG_EXAMPLE_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  auto calls = reinterpret_cast<int64_t (*)()>(dlsym(h, "mg_example_plugin_calls"));
  ASSERT_NE(calls, nullptr);
  const int64_t before = calls();

  for (mg::DType dt : {mg::DType::f64, mg::DType::f32, mg::DType::bf16, mg::DType::f16}) {
    const auto v = mg::test::random_values(37, 11);
    auto x = mg::test::make_tensor(v, {37}, dt, mg::Device::cpu());
    mg::Tensor y = mg::Tensor::empty({37}, dt);
    r.ops("cpu").squared_relu_fwd(y, x.t);
    std::vector<double> ref(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      ref[i] = x.rounded[i] > 0 ? x.rounded[i] * x.rounded[i] : 0.0;
    EXPECT_TRUE(mg::test::all_close(mg::test::to_doubles(y), ref, mg::test::tolerance(dt)))
        << mg::dtype_name(dt);

    Registry plain;
    mg::register_builtin(plain);
    mg::Tensor y2 = mg::Tensor::empty({37}, dt);
    plain.ops("cpu").squared_relu_fwd(y2, x.t);
    EXPECT_EQ(mg::test::to_doubles(y), mg::test::to_doubles(y2)) << mg::dtype_name(dt);
  }
  EXPECT_EQ(calls() - before, 4);
}

TEST(Plugin, FakeMusaPlatformIsSelectableAndPreferredOverCpu) {
  Registry r;
  mg::register_builtin(r);
  r.load_plugin(MG_TEST_PLUGIN_FAKE_MUSA_PATH);
  EXPECT_EQ(r.select_platform("musa").name(), "musa");
  const bool cuda_ok = r.find_platform("cuda") && r.find_platform("cuda")->availability().available;
  EXPECT_EQ(r.select_platform().name(), cuda_ok ? "cuda" : "musa");
  EXPECT_EQ(r.resolutions("musa")[static_cast<int>(mg::ops::OpId::fill)].provider,
            "plugin:fake_musa");
  // Its unimplemented slots are reported missing, not silently borrowed from the CPU.
  EXPECT_EQ(r.resolutions("musa")[static_cast<int>(mg::ops::OpId::gemm)].provider, "");
}

TEST(Plugin, LoadingThePathTwiceIsAnError) {
  Registry r;
  mg::register_builtin(r);
  r.load_plugin(MG_EXAMPLE_PLUGIN_PATH);
  const std::string msg = load_error(r, MG_EXAMPLE_PLUGIN_PATH);
  EXPECT_NE(msg.find("is already loaded (as 'example')"), std::string::npos) << msg;
  EXPECT_EQ(r.plugins().size(), 1u);
}

TEST(Plugin, MissingFileIsAClearError) {
  Registry r;
  const std::string msg = load_error(r, "/nonexistent/libnothing.so");
  EXPECT_NE(msg.find("cannot load plugin '/nonexistent/libnothing.so'"), std::string::npos) << msg;
}

TEST(Plugin, LibraryWithoutEntryPointIsRefused) {
  Registry r;
  const std::string msg = load_error(r, MG_TEST_PLUGIN_NO_ENTRY_PATH);
  EXPECT_NE(msg.find("is not a Megatron-CPP plugin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mg_plugin_descriptor"), std::string::npos) << msg;
  EXPECT_TRUE(r.plugins().empty());
}

TEST(Plugin, WrongApiVersionIsRefused) {
  Registry r;
  const std::string msg = load_error(r, MG_TEST_PLUGIN_BAD_VERSION_PATH);
  EXPECT_NE(msg.find("plugin API version " + std::to_string(MG_PLUGIN_API_VERSION + 41)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rebuild the plugin"), std::string::npos) << msg;
}

TEST(Plugin, OtherOpTableIsRefused) {
  Registry r;
  const std::string msg = load_error(r, MG_TEST_PLUGIN_BAD_HASH_PATH);
  EXPECT_NE(msg.find("different op table"), std::string::npos) << msg;
}

TEST(MegatronInfo, ShowsPlatformsOpsAndThePluginOverride) {
  const std::string bin = std::string(MG_BIN_DIR) + "/megatron_info";
  // The example plugin overrides a CPU op, and megatron_info prints the selected platform's table:
  // select the CPU explicitly so the case also holds on a machine with a GPU (where auto picks
  // cuda).
  auto res =
      run("env MG_PLATFORM=cpu MG_PLUGINS=" + std::string(MG_EXAMPLE_PLUGIN_PATH) + " " + bin);
  ASSERT_EQ(res.status, 0) << res.output;
  EXPECT_NE(res.output.find("example 1.0"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("plugin:example  (overrides cpu:"), std::string::npos) << res.output;
  for (const char* name : {"cuda", "musa", "txda", "cpu"})
    EXPECT_NE(res.output.find(std::string("\n  ") + name), std::string::npos) << name;
  EXPECT_NE(res.output.find("Selected platform:"), std::string::npos);
  EXPECT_EQ(res.output.find("MISSING"), std::string::npos) << res.output;
}

TEST(MegatronInfo, TableNamesThePreferredProvider) {
  Registry r;
  mg::register_builtin(r);
  const std::string builtin =
      r.resolutions("cpu")[static_cast<int>(mg::ops::OpId::squared_relu_fwd)].provider;
  const std::string bin = std::string(MG_BIN_DIR) + "/megatron_info";
  const std::string env =
      "env -u MG_OP_PROVIDERS MG_PLATFORM=cpu MG_PLUGINS=" + std::string(MG_EXAMPLE_PLUGIN_PATH);
  // Preferring the built-in kernel over the plugin's override: the table says so.
  auto res = run(env + " " + bin + " --op-provider squared_relu_fwd=" + builtin);
  ASSERT_EQ(res.status, 0) << res.output;
  EXPECT_NE(res.output.find(builtin + "  [preferred]  (overrides plugin:example)"),
            std::string::npos)
      << res.output;
  // The same through MG_OP_PROVIDERS.
  res = run(env + " MG_OP_PROVIDERS=squared_relu_fwd=" + builtin + " " + bin);
  ASSERT_EQ(res.status, 0) << res.output;
  EXPECT_NE(res.output.find(builtin + "  [preferred]"), std::string::npos) << res.output;
  // An unknown provider: non-zero, listing the slot's providers.
  res = run(env + " " + bin + " --op-provider squared_relu_fwd=nobody");
  EXPECT_NE(res.status, 0) << res.output;
  EXPECT_NE(res.output.find("its providers: plugin:example, " + builtin), std::string::npos)
      << res.output;
}

TEST(MegatronInfo, UnprovidedPlatformExitsNonZeroNamingTheAvailableOnes) {
  const std::string bin = std::string(MG_BIN_DIR) + "/megatron_info";
  auto res = run("env -u MG_PLUGINS MG_PLATFORM=musa " + bin);
  EXPECT_NE(res.status, 0) << res.output;
  EXPECT_NE(res.output.find("megatron_info: error: MG_PLATFORM='musa'"), std::string::npos)
      << res.output;
  EXPECT_NE(res.output.find("cpu: available"), std::string::npos) << res.output;
}

TEST(MegatronInfo, BadPluginExitsNonZero) {
  const std::string bin = std::string(MG_BIN_DIR) + "/megatron_info";
  auto res = run("env MG_PLUGINS=" + std::string(MG_TEST_PLUGIN_BAD_VERSION_PATH) + " " + bin);
  EXPECT_NE(res.status, 0) << res.output;
  EXPECT_NE(res.output.find("rebuild the plugin"), std::string::npos) << res.output;
}

}  // namespace
