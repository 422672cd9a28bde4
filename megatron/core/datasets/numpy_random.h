// numpy.random.RandomState, bit for bit, for the calls Megatron's GPT dataset makes
// (FORMATS.md §3.5): MT19937 seeded like RandomState(int) (init_genrand) or RandomState(array)
// (init_by_array), the raw 32-bit stream, random_sample(), the legacy bounded draw
// `random_interval` and the legacy 1-D `shuffle` / `permutation` built on it.
//
// Invariants: the state is the 624-word MT19937 array plus a position, exactly numpy's; every draw
// consumes the same 32-bit outputs numpy would, so interleaving calls keeps the streams in step
// (Megatron shuffles document_index and then shuffle_index with one generator).
// Not done: Gaussian / other distributions, legacy randint (it uses a different bounded-draw
// path), multi-dimensional shuffles, get_state/set_state. random_interval above 2^32-1 builds a
// 64-bit draw as (first << 32) | second, numpy's mt19937_next64 as GCC compiles it; this is not
// checked against numpy (it needs more than 4.29e9 elements).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace mg::datasets {

class NumpyRandomState {
 public:
  static constexpr int kStateLen = 624;

  // RandomState(seed) with an integer seed: MT19937 init_genrand (same as std::mt19937(seed)).
  explicit NumpyRandomState(uint32_t seed);
  // RandomState(key) with a 1-D array of uint32 words: MT19937 init_by_array. key must be
  // non-empty (numpy raises "Seed must be non-empty").
  explicit NumpyRandomState(std::span<const uint32_t> key);

  // The next raw 32-bit MT19937 output (numpy's next_uint32 / genrand_int32).
  uint32_t next_uint32();
  // random_sample(): a double on [0, 1) from two 32-bit outputs (a >> 5, b >> 6), 53-bit.
  double random_sample();
  // numpy's random_interval(max): uniform on [0, max] inclusive by masked rejection.
  uint64_t random_interval(uint64_t max);

  // Legacy RandomState.shuffle on a 1-D array: for i = n-1 down to 1, swap a[i] with
  // a[random_interval(i)]. The algorithm does not depend on the element type.
  template <typename T>
  void shuffle(std::span<T> a) {
    for (std::size_t i = a.size(); i-- > 1;) {
      const std::size_t j = static_cast<std::size_t>(random_interval(i));
      std::swap(a[i], a[j]);
    }
  }
  template <typename T>
  void shuffle(std::vector<T>& a) {
    shuffle(std::span<T>(a));
  }
  // RandomState.permutation(n): arange(n) (int64), shuffled.
  std::vector<int64_t> permutation(int64_t n);

 private:
  void init_genrand(uint32_t seed);
  void generate();

  std::array<uint32_t, kStateLen> mt_{};
  int pos_ = kStateLen;
};

}  // namespace mg::datasets
