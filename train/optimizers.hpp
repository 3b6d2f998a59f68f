#pragma once

// The sequential loop's optimizer, as a job's settings choose it: SGD with
// momentum (model/optimizer.hpp) or AdamW (kernels::adamw_step).

#include <memory>

#include "model/optimizer.hpp"
#include "train/job.hpp"

namespace troupe::train {

/// AdamW (Loshchilov & Hutter): betas 0.9 and 0.999, eps 1e-8, weight decay
/// decoupled from the gradient, on the parameters decays() names only. Its
/// state (a checkpoint's) is "adamw.step" and the moments
/// "adamw.m/<parameter>", "adamw.v/<parameter>".
std::unique_ptr<model::optimizer> make_adamw(float lr, float weight_decay);

/// Whether AdamW's weight decay applies to `p`: the weight matrices and
/// kernels (rank 2 and more), not biases and norms' gains and shifts (rank 1)
/// and not the token and position embeddings (as GPT-2's and nanoGPT's
/// training leave them undecayed).
bool decays(const model::parameter& p);
/// The same for a tensor called `name` of shape `s` (a shard's part of the model).
bool decays(const std::string& name, const shape& s);

/// The optimizer `s` names (s.optimizer), at s.lr with s.momentum and s.weight_decay.
std::unique_ptr<model::optimizer> make_optimizer(const settings& s);

} // namespace troupe::train
