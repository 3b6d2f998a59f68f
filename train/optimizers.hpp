#pragma once

// The sequential loop's optimizer, as a job's settings choose it: SGD with
// momentum (model/optimizer.hpp) or AdamW (kernels::adamw_step).

#include <memory>

#include "model/optimizer.hpp"
#include "train/job.hpp"

namespace troupe::train {

/// AdamW (Loshchilov & Hutter): betas 0.9 and 0.999, eps 1e-8, weight decay
/// decoupled from the gradient. Its state (a checkpoint's) is "adamw.step" and
/// the moments "adamw.m/<parameter>", "adamw.v/<parameter>".
std::unique_ptr<model::optimizer> make_adamw(float lr, float weight_decay);

/// The optimizer `s` names (s.optimizer), at s.lr with s.momentum and s.weight_decay.
std::unique_ptr<model::optimizer> make_optimizer(const settings& s);

} // namespace troupe::train
