#pragma once
// Counter-based randomness: every random draw is a pure function of its coordinates, so data
// sampling and initialisation are reproducible from (seed, iteration, replica, micro-batch, ...)
// on any number of workers without shared generator state.
#include <cstdint>
#include <initializer_list>

namespace longhaul {

// constexpr, so that the CUDA kernels call it too (--expt-relaxed-constexpr): the same draws there.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of an ordered list of coordinates.
inline uint64_t HashCoords(std::initializer_list<uint64_t> coords) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t c : coords) h = SplitMix64(h ^ SplitMix64(c));
  return h;
}

// Uniform double in [0, 1) from 64 random bits.
inline double UnitDouble(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Sequential generator for bulk streams (corpus generation, weight init).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64(state_++); }
  double Uniform() { return UnitDouble(Next()); }
  // Standard normal by Box-Muller; one value per call keeps the stream position simple.
  double Normal();

 private:
  uint64_t state_;
};

}  // namespace longhaul
