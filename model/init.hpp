#pragma once

// Weight initialisation shared by the layers (model/layers.cpp,
// model/sequence_layers.cpp): draws made from std::mt19937_64's raw output,
// so that a seed gives the same weights with every standard library.

#include <cstdint>
#include <random>

#include "model/layer.hpp"

namespace troupe::model {

/// N(0, sd^2) into every element of `w`.
void init_normal(tensor& w, float sd, std::mt19937_64& rng);
/// `s`'s weights for a layer of `fan_in` inputs and `fan_out` outputs, their
/// spread (standard deviation or limit) times `scale`.
void init_weights(tensor& w, int64_t fan_in, int64_t fan_out, init_scheme s, std::mt19937_64& rng,
                  float scale = 1.0f);

/// While one lives (on its thread), init_normal and init_weights leave the
/// values as they are and only advance `rng` as their draws would (so that
/// what is drawn after them, a dropout layer's seed, stays the same): for a
/// model whose every parameter a checkpoint is about to overwrite, built
/// without computing values nothing reads (a third of the time a 25 M
/// parameter gpt takes to load).
class no_initial_draws {
public:
  no_initial_draws();
  ~no_initial_draws();
  no_initial_draws(const no_initial_draws&) = delete;
  no_initial_draws& operator=(const no_initial_draws&) = delete;

private:
  bool before_;
};

} // namespace troupe::model
