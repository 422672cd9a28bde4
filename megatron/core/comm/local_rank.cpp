// Node-local rank from the launcher's environment, and the device it selects (local_rank.h).
#include "megatron/core/comm/local_rank.h"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "megatron/core/common/error.h"

namespace mg::comm {

namespace {

// A non-negative decimal int with optional surrounding blanks; otherwise an error naming var.
int parse_local_rank(const char* var, const char* value) {
  const std::string v(value);
  std::size_t i = 0, end = v.size();
  while (i < end && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  while (end > i && std::isspace(static_cast<unsigned char>(v[end - 1]))) --end;
  const bool digits_only = i < end && [&] {
    for (std::size_t k = i; k < end; ++k)
      if (!std::isdigit(static_cast<unsigned char>(v[k]))) return false;
    return true;
  }();
  MG_CHECK(digits_only, var << "='" << v
                            << "' is not a local rank: expected a non-negative integer (the "
                               "process's rank on its node, set by the launcher)");
  long long r = 0;
  for (std::size_t k = i; k < end; ++k) {
    r = r * 10 + (v[k] - '0');
    MG_CHECK(r <= std::numeric_limits<int>::max(),
             var << "='" << v << "' is out of range for a local rank");
  }
  return static_cast<int>(r);
}

}  // namespace

LocalRank local_rank_from(const GetEnv& getenv) {
  for (const char* var : kLocalRankVars) {
    if (const char* v = getenv(var)) return {parse_local_rank(var, v), var};
  }
  return {0, "default"};
}

LocalRank local_rank() {
  return local_rank_from([](const char* var) { return std::getenv(var); });
}

int select_device(int local_rank, int device_count) {
  MG_CHECK(device_count > 0, "select_device: no device to select (device count "
                                 << device_count << ") for local rank " << local_rank);
  MG_CHECK(local_rank >= 0, "select_device: negative local rank " << local_rank);
  return local_rank % device_count;
}

}  // namespace mg::comm
