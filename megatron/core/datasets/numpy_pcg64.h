// numpy.random's default generator, bit for bit, for what Megatron's MockGPTLowLevelDataset draws
// (FORMATS.md §3.12): SeedSequence(int).generate_state, the PCG64 bit generator seeded from it
// (default_rng(seed).bit_generator), its raw 64-bit and buffered 32-bit outputs, and
// Generator.integers(low, high, dtype=int32/uint32) via the bounded Lemire draw.
//
// Invariants: the state is PCG64's 128-bit LCG state and increment plus numpy's one-word uint32
// buffer, so mixing next_uint32 and bounded draws consumes exactly the words numpy would.
// Not done: SeedSequence with spawn keys, array entropy or pool sizes other than 4; PCG64DXSM;
// jumped/advance; 64-bit bounded draws; the masked (use_masked=True) path; floating-point draws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mg::datasets {

// SeedSequence(entropy).generate_state(n_words, uint32) for a non-negative integer entropy
// (numpy splits it into little-endian 32-bit words; pool size 4, no spawn key).
std::vector<uint32_t> seed_sequence_generate_state(uint64_t entropy, std::size_t n_words);

class NumpyPCG64 {
 public:
  __extension__ using u128 = unsigned __int128;

  // numpy.random.PCG64(seed) == default_rng(seed).bit_generator: SeedSequence(seed) gives four
  // uint64 words; (w0:w1) is the initial state and (w2:w3) the stream, high word first.
  explicit NumpyPCG64(uint64_t seed);

  // numpy's pcg64_set_seed / pcg_setseq_128_srandom_r on an explicit initial state and stream.
  static NumpyPCG64 from_seed_words(u128 initstate, u128 initseq);

  u128 state() const { return state_; }
  u128 increment() const { return inc_; }

  // pcg64_next64: one LCG step, then XSL-RR of the new state.
  uint64_t next_uint64();
  // pcg64_next32: the low half of a 64-bit output first, the high half on the next call.
  uint32_t next_uint32();
  // numpy's buffered_bounded_lemire_uint32: uniform on [0, rng] inclusive; rng < 2^32 - 1.
  uint32_t bounded_lemire_uint32(uint32_t rng);
  // Generator.integers(low, high, size, dtype=int32) (endpoint=False): low + draws on
  // [0, high - 1 - low]; rng == 0 draws nothing, rng == 2^32 - 1 takes raw next_uint32.
  std::vector<int32_t> integers_int32(int32_t low, int32_t high, std::size_t size);
  // The same for dtype=uint32 with high up to 2^32 (endpoint=False).
  std::vector<uint32_t> integers_uint32(uint32_t low, uint64_t high, std::size_t size);

 private:
  NumpyPCG64() = default;
  void step();
  uint32_t bounded_uint32(uint32_t off, uint32_t rng);

  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

}  // namespace mg::datasets
