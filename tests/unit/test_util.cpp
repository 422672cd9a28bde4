#include "tests/unit/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>

namespace mg::test {

void ensure_runtime() {
  mg::init();
}

std::vector<std::string> op_test_platforms() {
  ensure_runtime();
  std::vector<std::string> out;
  for (const auto& st : plugin::global_registry().platform_statuses())
    if (st.registered) out.push_back(st.name);
  // cpu first: it is the reference platform and always runs
  std::stable_partition(out.begin(), out.end(), [](const std::string& n) { return n == "cpu"; });
  return out;
}

std::optional<std::string> unavailable_reason(const std::string& platform) {
  ensure_runtime();
  plugin::Platform* p = plugin::global_registry().find_platform(platform);
  if (!p) return "not registered in this build";
  auto av = p->availability();
  if (!av.available) return av.reason;
  return std::nullopt;
}

Device device_for(const std::string& platform) {
  ensure_runtime();
  plugin::Platform* p = plugin::global_registry().find_platform(platform);
  MG_CHECK(p != nullptr, "platform " << platform << " not registered");
  return Device{p->device_type(), 0};
}

const ops::OpTable& ops_on(const std::string& platform) {
  ensure_runtime();
  return plugin::global_registry().ops(platform);
}

std::vector<double> random_values(std::size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  std::vector<double> v(n);
  for (auto& x : v) x = neg(gen) ? -mag(gen) : mag(gen);
  return v;
}

TestTensor make_tensor(const std::vector<double>& values, const Shape& shape, DType dtype,
                       Device device) {
  Tensor host = Tensor::from_vector(values, shape, dtype);
  TestTensor out;
  out.rounded = host.to_vector<double>();
  out.t = host.to(device);
  return out;
}

std::vector<double> to_doubles(const Tensor& t) {
  return t.to_vector<double>();
}

Tol tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-12, 1e-10};
    case DType::f32:
      return {1e-5, 1e-4};
    case DType::bf16:
      return {1e-2, 1.6e-2};
    case DType::f16:
      return {2e-3, 4e-3};
    default:
      return {0.0, 0.0};
  }
}

::testing::AssertionResult all_close(const std::vector<double>& actual,
                                     const std::vector<double>& expected, Tol tol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected size " << expected.size();
  std::ostringstream os;
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok = (std::isnan(a) && std::isnan(e)) || (a == e) ||
                    std::abs(a - e) <= tol.atol + tol.rtol * std::abs(e);
    if (!ok) {
      worst = std::max(worst, std::abs(a - e));
      if (bad < 8) os << "\n  [" << i << "] actual " << a << " expected " << e;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ (atol " << tol.atol << ", rtol "
         << tol.rtol << ", worst |diff| " << worst << ")" << os.str();
}

std::vector<double> numerical_gradient(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double h) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double fp = f(x);
    x[i] = xi - h;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

CommandResult run_command(const std::string& cmd) {
  CommandResult res;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return res;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) res.output.append(buf, n);
  const int st = pclose(p);
  res.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return res;
}

std::string param_name(const std::string& platform, DType dtype) {
  return platform + "_" + std::string(dtype_name(dtype));
}

std::string scratch_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::vector<std::string> flags_with(const std::vector<std::pair<std::string, std::string>>& base,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> f;
  for (const auto& [k, v] : base)
    if (std::find(extra.begin(), extra.end(), k) == extra.end()) f.insert(f.end(), {k, v});
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

}  // namespace mg::test
