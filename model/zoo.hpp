#pragma once

#include <string>
#include <vector>

#include "model/model.hpp"

namespace troupe::zoo {

/// MLP 784-256-128-10 with ReLU, for 1x28x28 images.
model::model mlp();
/// conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64 3x3 pad 1, ReLU, maxpool 2,
/// dense 3136->128, ReLU, dense 128->10.
model::model cnn();
/// "mlp" or "cnn"; throws troupe::error listing the choices otherwise.
model::model by_name(const std::string& name);
std::vector<std::string> names();

} // namespace troupe::zoo
