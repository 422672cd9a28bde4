// Shared helpers for the unit tests: runtime set-up, the platforms an op conformance test runs on,
// random inputs (never zeros), dtype tolerances, comparisons and finite-difference gradients.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/plugin/registry.h"
#include "megatron/runtime.h"

namespace mg::test {

// mg::init() once (honours MG_PLATFORM); every built-in platform is registered either way.
void ensure_runtime();

// Platforms an op conformance test is instantiated for: "cpu", plus "cuda" when the build has it.
// A test on an unavailable platform must GTEST_SKIP() with unavailable_reason().
std::vector<std::string> op_test_platforms();
std::optional<std::string> unavailable_reason(const std::string& platform);
Device device_for(const std::string& platform);
const ops::OpTable& ops_on(const std::string& platform);

// Skips the current test (with the reason printed) when `platform` is not usable here.
#define MG_SKIP_IF_UNAVAILABLE(platform)                                              \
  do {                                                                                \
    if (auto mg_reason_ = ::mg::test::unavailable_reason(platform))                   \
      GTEST_SKIP() << "platform '" << (platform) << "' unavailable: " << *mg_reason_; \
  } while (0)

// n values uniform in [lo, hi] with a random sign, deterministic from seed; |v| >= lo > 0.
std::vector<double> random_values(std::size_t n, uint64_t seed, double lo = 0.1, double hi = 1.0);

// A tensor of dtype on device holding `values` rounded to dtype, and those rounded values (what a
// reference must be computed from).
struct TestTensor {
  Tensor t;
  std::vector<double> rounded;
};
TestTensor make_tensor(const std::vector<double>& values, const Shape& shape, DType dtype,
                       Device device);
std::vector<double> to_doubles(const Tensor& t);

// The float dtypes every kernel supports.
inline const std::vector<DType> kKernelDTypes = {DType::f64, DType::f32, DType::bf16, DType::f16};

struct Tol {
  double atol;
  double rtol;
};
// Tolerance for results stored in dtype (f64 math for f64, f32 math otherwise).
Tol tolerance(DType dtype);

// |a - e| <= atol + rtol * |e| for every element; the message names the first failures.
::testing::AssertionResult all_close(const std::vector<double>& actual,
                                     const std::vector<double>& expected, Tol tol);

// Central differences of f at x, step h (use f64 kernels).
std::vector<double> numerical_gradient(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double h = 1e-6);

// Runs f, expects it to throw mg::Error, and returns the error's user-facing message (without the
// source location); records a test failure and returns "" when nothing is thrown.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const mg::Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected mg::Error";
  return "";
}

// Runs a shell command (stderr merged into stdout); status is the exit code, -1 if it did not exit.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult run_command(const std::string& cmd);

// A fresh, empty folder <tmp>/<prefix>_<pid>/<name> for a test's files.
std::string scratch_dir(const std::string& prefix, const std::string& name);

// Command-line flags: each (flag, value) of `base` that `extra` does not give, then `extra`.
std::vector<std::string> flags_with(const std::vector<std::pair<std::string, std::string>>& base,
                                    const std::vector<std::string>& extra);

// Name suffix for parameterised tests: "cpu_f32".
std::string param_name(const std::string& platform, DType dtype);

// The parameter of an op conformance test, and its gtest name.
using PlatformDType = std::tuple<std::string, DType>;
struct PlatformDTypeName {
  std::string operator()(const ::testing::TestParamInfo<PlatformDType>& info) const {
    return param_name(std::get<0>(info.param), std::get<1>(info.param));
  }
};

}  // namespace mg::test

// Instantiates an op test suite (a TestWithParam<mg::test::PlatformDType>) for every registered
// platform x every kernel dtype, named "Ops/Suite.Case/cpu_f32".
#define MG_INSTANTIATE_OP_TEST(Suite)                                          \
  INSTANTIATE_TEST_SUITE_P(                                                    \
      Ops, Suite,                                                              \
      ::testing::Combine(::testing::ValuesIn(::mg::test::op_test_platforms()), \
                         ::testing::ValuesIn(::mg::test::kKernelDTypes)),      \
      ::mg::test::PlatformDTypeName{})

namespace mg::test {}  // namespace mg::test
