// numpy SeedSequence + PCG64 + bounded Lemire draws (see numpy_pcg64.h). Follows numpy's
// bit_generator.pyx (SeedSequence), pcg64.h/.c and distributions.c (random_bounded_uint32_fill,
// buffered_bounded_lemire_uint32), checked against numpy in mock_gpt_dataset_test.cpp.
#include "megatron/core/datasets/numpy_pcg64.h"

#include <array>
#include <limits>

#include "megatron/core/common/error.h"

namespace mg::datasets {
namespace {

// bit_generator.pyx constants (32-bit words, XSHIFT = 4 * 8 / 2).
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr std::size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

NumpyPCG64::u128 make_u128(uint64_t high, uint64_t low) {
  return (static_cast<NumpyPCG64::u128>(high) << 64) | low;
}

// PCG_DEFAULT_MULTIPLIER_128.
const NumpyPCG64::u128 kPcgMult = make_u128(2549297995355413924ULL, 4865540595714422341ULL);

}  // namespace

std::vector<uint32_t> seed_sequence_generate_state(uint64_t entropy, std::size_t n_words) {
  // _int_to_uint32_array: 0 -> [0]; otherwise little-endian 32-bit words, no leading zeros.
  std::vector<uint32_t> words;
  if (entropy == 0) words.push_back(0);
  for (uint64_t e = entropy; e > 0; e >>= 32) words.push_back(static_cast<uint32_t>(e));

  // mix_entropy: hash each word (zeros past the entropy) into the pool, then cross-mix.
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (std::size_t i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < words.size() ? words[i] : 0u, hash_const);
  for (std::size_t src = 0; src < kPoolSize; ++src)
    for (std::size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  // At most 2 entropy words, so numpy's loop over words beyond the pool never runs.

  std::vector<uint32_t> out(n_words);
  uint32_t hash_b = kInitB;
  for (std::size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_b;
    hash_b *= kMultB;
    v *= hash_b;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

NumpyPCG64 NumpyPCG64::from_seed_words(u128 initstate, u128 initseq) {
  NumpyPCG64 g;
  g.state_ = 0;
  g.inc_ = (initseq << 1) | 1;
  g.step();
  g.state_ += initstate;
  g.step();
  return g;
}

NumpyPCG64::NumpyPCG64(uint64_t seed) {
  // generate_state(4, uint64): pairs of uint32 viewed as little-endian uint64.
  const std::vector<uint32_t> w = seed_sequence_generate_state(seed, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = (static_cast<uint64_t>(w[2 * i + 1]) << 32) | w[2 * i];
  *this = from_seed_words(make_u128(v[0], v[1]), make_u128(v[2], v[3]));
}

void NumpyPCG64::step() {
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPCG64::next_uint64() {
  step();
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t NumpyPCG64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

uint32_t NumpyPCG64::bounded_lemire_uint32(uint32_t rng) {
  MG_CHECK(rng != std::numeric_limits<uint32_t>::max(),
           "bounded_lemire_uint32: rng 4294967295 has no excluded bound; use next_uint32");
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    // Reject the (2^32 mod rng_excl) low values that would bias the result.
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(next_uint32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

uint32_t NumpyPCG64::bounded_uint32(uint32_t off, uint32_t rng) {
  if (rng == 0) return off;
  if (rng == std::numeric_limits<uint32_t>::max()) return off + next_uint32();
  return off + bounded_lemire_uint32(rng);
}

std::vector<int32_t> NumpyPCG64::integers_int32(int32_t low, int32_t high, std::size_t size) {
  MG_CHECK(low < high, "integers_int32: low " << low << " >= high " << high);
  // numpy computes rng = (high - 1) - low and off = low in uint32 arithmetic.
  const uint32_t rng = static_cast<uint32_t>(static_cast<int64_t>(high) - 1 - low);
  std::vector<int32_t> out(size);
  for (auto& v : out) v = static_cast<int32_t>(bounded_uint32(static_cast<uint32_t>(low), rng));
  return out;
}

std::vector<uint32_t> NumpyPCG64::integers_uint32(uint32_t low, uint64_t high, std::size_t size) {
  MG_CHECK(low < high && high <= (uint64_t{1} << 32),
           "integers_uint32: need low < high <= 2^32, got low " << low << " high " << high);
  const uint32_t rng = static_cast<uint32_t>(high - 1 - low);
  std::vector<uint32_t> out(size);
  for (auto& v : out) v = bounded_uint32(low, rng);
  return out;
}

}  // namespace mg::datasets
