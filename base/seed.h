// Seeding helpers shared by every layer that draws random numbers: mixing two 64-bit values into
// a well-spread seed (one per epoch, sample, step or rank), and a uniform double in [0, 1) from
// a 64-bit generator. Results depend on the seeds alone, never on threads or timing.
#pragma once

#include <cstdint>
#include <random>

namespace trainer {

// 64-bit mixing (splitmix64): seeds derived from (seed, epoch, record) are unrelated streams.
uint64_t mix_seed(uint64_t a, uint64_t b);

// Uniform in [0, 1) from 53 random bits (portable across standard libraries).
inline double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace trainer
