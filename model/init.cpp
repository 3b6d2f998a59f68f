#include "model/init.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::model {

namespace {

float uniform01(std::mt19937_64& rng) { return static_cast<float>((rng() >> 40) * (1.0 / 16777216.0)); }

// Box-Muller from our own uniform draws: identical across standard libraries.
float normal(std::mt19937_64& rng) {
  float u1 = std::max(uniform01(rng), 1e-7f), u2 = uniform01(rng);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
}

thread_local bool draw_values = true;  // false while a no_initial_draws lives

} // namespace

no_initial_draws::no_initial_draws() : before_(draw_values) { draw_values = false; }
no_initial_draws::~no_initial_draws() { draw_values = before_; }

void init_normal(tensor& w, float sd, std::mt19937_64& rng) {
  if (!draw_values) return rng.discard(2 * static_cast<unsigned long long>(w.numel()));  // normal()'s two draws
  float* p = w.data();
  for (int64_t i = 0; i < w.numel(); ++i) p[i] = sd * normal(rng);
}

void init_weights(tensor& w, int64_t fan_in, int64_t fan_out, init_scheme s, std::mt19937_64& rng, float scale) {
  if (s == init_scheme::he) return init_normal(w, scale * std::sqrt(2.0f / static_cast<float>(fan_in)), rng);
  if (s == init_scheme::gpt2) return init_normal(w, scale * 0.02f, rng);
  if (!draw_values) return rng.discard(static_cast<unsigned long long>(w.numel()));
  const float lim = scale * std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  float* p = w.data();
  for (int64_t i = 0; i < w.numel(); ++i) p[i] = lim * (2.0f * uniform01(rng) - 1.0f);
}

} // namespace troupe::model
