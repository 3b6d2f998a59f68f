#include "model/zoo.hpp"

#include "model/nn.hpp"

namespace troupe::zoo {

using namespace troupe::nn;

model::model mlp() {
  return sequential(flatten(), dense(784, 256), relu(), dense(256, 128), relu(), dense(128, 10));
}

model::model cnn() {
  return sequential(conv2d(1, 32, 3).padding(1), relu(), max_pool2d(2),
                    conv2d(32, 64, 3).padding(1), relu(), max_pool2d(2),
                    flatten(), dense(3136, 128), relu(), dense(128, 10));
}

std::vector<std::string> names() { return {"mlp", "cnn"}; }

model::model by_name(const std::string& name) {
  if (name == "mlp") return mlp();
  if (name == "cnn") return cnn();
  throw error("unknown model '" + name + "': choose mlp or cnn");
}

} // namespace troupe::zoo
