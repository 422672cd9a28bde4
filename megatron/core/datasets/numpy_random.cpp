// numpy.random.RandomState-compatible MT19937 (see numpy_random.h). The generator and seeding
// routines follow numpy/random/src/mt19937/{mt19937.c, randomkit} and the legacy bounded draw
// follows numpy/random/src/distributions/distributions.c (random_interval).
#include "megatron/core/datasets/numpy_random.h"

#include "megatron/core/common/error.h"

namespace mg::datasets {

namespace {
constexpr uint32_t kMatrixA = 0x9908b0dfU;
constexpr uint32_t kUpperMask = 0x80000000U;
constexpr uint32_t kLowerMask = 0x7fffffffU;
constexpr int kM = 397;
}  // namespace

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  init_genrand(seed);
}

NumpyRandomState::NumpyRandomState(std::span<const uint32_t> key) {
  MG_CHECK(!key.empty(), "NumpyRandomState: the seed array must be non-empty");
  init_genrand(19650218U);
  const std::size_t n = static_cast<std::size_t>(kStateLen);
  std::size_t i = 1, j = 0;
  for (std::size_t k = (n > key.size() ? n : key.size()); k != 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] +
             static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= n) {
      mt_[0] = mt_[n - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (std::size_t k = n - 1; k != 0; --k) {
    mt_[i] =
        (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= n) {
      mt_[0] = mt_[n - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000U;  // MSB set: the state is never all zero.
  pos_ = kStateLen;
}

void NumpyRandomState::init_genrand(uint32_t seed) {
  mt_[0] = seed;
  for (int i = 1; i < kStateLen; ++i) {
    mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  pos_ = kStateLen;
}

void NumpyRandomState::generate() {
  int i = 0;
  for (; i < kStateLen - kM; ++i) {
    const uint32_t y = (mt_[i] & kUpperMask) | (mt_[i + 1] & kLowerMask);
    mt_[i] = mt_[i + kM] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  }
  for (; i < kStateLen - 1; ++i) {
    const uint32_t y = (mt_[i] & kUpperMask) | (mt_[i + 1] & kLowerMask);
    mt_[i] = mt_[i + (kM - kStateLen)] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  }
  const uint32_t y = (mt_[kStateLen - 1] & kUpperMask) | (mt_[0] & kLowerMask);
  mt_[kStateLen - 1] = mt_[kM - 1] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  pos_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (pos_ == kStateLen) generate();
  uint32_t y = mt_[pos_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= (y >> 18);
  return y;
}

double NumpyRandomState::random_sample() {
  const uint32_t a = next_uint32() >> 5;
  const uint32_t b = next_uint32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value = 0;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while (true) {
      const uint64_t hi = next_uint32();  // Evaluation order as GCC builds numpy (see header).
      const uint64_t lo = next_uint32();
      value = ((hi << 32) | lo) & mask;
      if (value <= max) break;
    }
  }
  return value;
}

std::vector<int64_t> NumpyRandomState::permutation(int64_t n) {
  MG_CHECK(n >= 0, "NumpyRandomState::permutation: n must be >= 0, got " << n);
  std::vector<int64_t> a(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = i;
  shuffle(a);
  return a;
}

}  // namespace mg::datasets
