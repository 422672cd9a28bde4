// The training loop's guards (reliability.h).
#include "megatron/training/reliability.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace mg::training {
namespace {

bool host_finite(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype())) return true;
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

bool all_finite(const ops::OpTable& ops, std::span<const Tensor> xs) {
  std::vector<Tensor> fl;
  for (const Tensor& t : xs)
    if (t.defined() && t.numel() > 0 && is_floating(t.dtype())) fl.push_back(t);
  if (fl.empty()) return true;
  Tensor out = Tensor::empty({1}, DType::f64, fl.front().device());
  ops.l2_norm_sq(out, fl);
  return std::isfinite(out.to_vector<double>()[0]);
}

std::optional<std::string> first_nonfinite_parameter(const std::vector<transformer::Parameter>& ps,
                                                     bool grads) {
  for (const auto& p : ps)
    if (!host_finite(grads ? p.main_grad : p.param)) return p.name;
  return std::nullopt;
}

std::optional<std::string> first_nonfinite_state(const optimizer::StateDict& sd) {
  for (const auto& [k, t] : sd.tensors)
    if (!host_finite(t)) return k;
  return std::nullopt;
}

int local_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                        "MPI_LOCALNRANKS"}) {
    const char* s = std::getenv(v);
    if (!s || !*s) continue;
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (end && *end == '\0' && n >= 1) return static_cast<int>(n);
  }
  return 1;
}

AvailableMemory available_memory(const plugin::Platform& platform, int device) {
  AvailableMemory a;
  const double total = static_cast<double>(platform.capabilities(device).total_memory_bytes);
  std::ostringstream what;
  if (platform.device_type() == DeviceType::cpu) {
    const int n = local_world_size();
    a.bytes = total / n;
    what << "host memory " << format_bytes(total);
    if (n > 1) what << " / " << n << " ranks on this node = " << format_bytes(a.bytes);
  } else {
    a.bytes = total;
    what << "device " << platform.name() << ":" << device << " memory " << format_bytes(total);
  }
  a.what = what.str();
  return a;
}

}  // namespace mg::training
