// mg::init (megatron/runtime.h): the process's set-up is established once and a later call that
// asks for another one (platform, plugins) is an error naming both; each distinct set of run
// choices (--deterministic-mode, op providers, MG_OP_PROVIDERS) gets its own immutable Runtime and
// op table, so two runs in one process never see each other's setting; invalid provider choices
// are errors listing the valid ones; Runtime::resolutions() names the chosen provider.
#include <cstdlib>
#include <optional>
#include <string>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

// Sets (or unsets, for nullptr) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

const plugin::Resolution& slot_of(const std::vector<plugin::Resolution>& table,
                                  std::string_view slot) {
  for (const auto& r : table)
    if (r.slot == slot) return r;
  throw std::runtime_error("no slot " + std::string(slot));
}

TEST(Runtime, SameChoicesSameRuntimeOtherChoicesTheirOwn) {
  const ScopedEnv env("MG_OP_PROVIDERS", nullptr);
  Runtime& a = mg::init();
  EXPECT_EQ(&a, &mg::init());
  EXPECT_FALSE(a.deterministic());
  Runtime& det = mg::init(RuntimeOptions{.deterministic = true});
  EXPECT_NE(&det, &a);
  EXPECT_TRUE(det.deterministic());
  EXPECT_FALSE(mg::init().deterministic());  // the other run's setting did not leak
  EXPECT_EQ(&det, &mg::init(RuntimeOptions{.deterministic = true}));
  // One process set-up: same registry, platform and device.
  EXPECT_EQ(det.registry, a.registry);
  EXPECT_EQ(det.platform, a.platform);
  EXPECT_EQ(det.device, a.device);
  EXPECT_NE(det.ops, a.ops);  // each run's own table
  EXPECT_EQ(det.ops, &a.registry->ops(a.platform->name(), det.resolve));
}

TEST(Runtime, AnotherPlatformIsAnErrorNamingBoth) {
  Runtime& rt = mg::init();
  const std::string other = rt.platform->name() == "cpu" ? "musa" : "cpu";
  const std::string msg = test::error_message([&] { mg::init(RuntimeOptions{.platform = other}); });
  EXPECT_NE(msg.find("platform '" + other + "' requested"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set up on platform '" + std::string(rt.platform->name()) + "'"),
            std::string::npos)
      << msg;
  // The established platform, named, is fine.
  EXPECT_EQ(&mg::init(RuntimeOptions{.platform = std::string(rt.platform->name())}), &rt);
}

TEST(Runtime, APluginNotLoadedByTheFirstCallIsAnError) {
  mg::init();
  const std::string msg =
      test::error_message([] { mg::init(RuntimeOptions{.plugins = {MG_EXAMPLE_PLUGIN_PATH}}); });
  EXPECT_NE(msg.find(std::string("plugin '") + MG_EXAMPLE_PLUGIN_PATH + "' requested"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("set up with plugins: "), std::string::npos) << msg;
  const std::string env_msg = test::error_message([] {
    const ScopedEnv env("MG_PLUGINS", MG_EXAMPLE_PLUGIN_PATH);
    mg::init();
  });
  EXPECT_NE(env_msg.find("requested"), std::string::npos) << env_msg;
  // Not reading MG_PLUGINS asks for nothing.
  const ScopedEnv env("MG_PLUGINS", MG_EXAMPLE_PLUGIN_PATH);
  EXPECT_NO_THROW(mg::init(RuntimeOptions{.load_env_plugins = false}));
}

TEST(Runtime, OpProvidersArePerRunAndValidated) {
  const ScopedEnv env("MG_OP_PROVIDERS", nullptr);
  Runtime& plain = mg::init();
  const std::string platform(plain.platform->name());
  const std::string fill = slot_of(plain.resolutions(), "fill").provider;
  ASSERT_FALSE(fill.empty());
  EXPECT_FALSE(slot_of(plain.resolutions(), "fill").preferred);

  Runtime& pref = mg::init(RuntimeOptions{.op_providers = {{"fill", fill}}});
  EXPECT_NE(&pref, &plain);
  EXPECT_EQ(pref.resolve.providers.at("fill"), fill);
  EXPECT_TRUE(slot_of(pref.resolutions(), "fill").preferred);
  EXPECT_EQ(slot_of(pref.resolutions(), "fill").provider, fill);

  std::string msg = test::error_message([] {
    mg::init(RuntimeOptions{.op_providers = {{"fill", "nobody:fill"}}});
  });
  EXPECT_NE(msg.find("has no provider 'nobody:fill' on platform '" + platform +
                     "'; its providers: " + fill),
            std::string::npos)
      << msg;
  msg = test::error_message([] { mg::init(RuntimeOptions{.op_providers = {{"fil", "x"}}}); });
  EXPECT_NE(msg.find("'fil' is not an op slot; slots: gemm"), std::string::npos) << msg;
}

TEST(Runtime, MgOpProvidersIsReadAndValidated) {
  Runtime& plain = mg::init(RuntimeOptions{.load_env_op_providers = false});
  const std::string fill = slot_of(plain.resolutions(), "fill").provider;
  {
    const ScopedEnv env("MG_OP_PROVIDERS", ("fill=" + fill).c_str());
    Runtime& rt = mg::init();
    EXPECT_TRUE(slot_of(rt.resolutions(), "fill").preferred);
    EXPECT_EQ(rt.resolve.providers.at("fill"), fill);
    // An explicit option overrides the variable's entry for its slot; load_env_op_providers
    // = false ignores the variable.
    EXPECT_EQ(&mg::init(RuntimeOptions{.load_env_op_providers = false}), &plain);
  }
  {
    const ScopedEnv env("MG_OP_PROVIDERS", "fill=nobody:fill");
    const std::string msg = test::error_message([] { mg::init(); });
    EXPECT_NE(msg.find("MG_OP_PROVIDERS"), std::string::npos) << msg;
    EXPECT_NE(msg.find("its providers: " + fill), std::string::npos) << msg;
    EXPECT_NO_THROW(mg::init(RuntimeOptions{.op_providers = {{"fill", fill}}}));
  }
  {
    const ScopedEnv env("MG_OP_PROVIDERS", "fill");
    const std::string msg = test::error_message([] { mg::init(); });
    EXPECT_NE(msg.find("MG_OP_PROVIDERS: entry 'fill' is not slot=provider"), std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace mg
