#pragma once

// troupe's public API, all of it: the model-definition DSL, data sources, the
// job, troupe::fit, evaluation, job files and the trainer's command line.
//
//   #include <troupe/troupe.hpp>
//   using namespace troupe;
//   auto j = job()
//       .model([] { return nn::sequential(nn::flatten(), nn::dense(784, 128), nn::relu(), nn::dense(128, 10)); })
//       .data(data::fashion_mnist())
//       .algorithm(ddc_asgd().workers(4))
//       .epochs(5);
//   history h = fit(j);
//
// Free of CAF and Cap'n Proto headers: including it is cheap.

#include "tensor/tensor.hpp"
#include "kernels/kernels.hpp"
#include "model/model.hpp"
#include "model/nn.hpp"
#include "model/optimizer.hpp"
#include "model/zoo.hpp"
#include "data/dataset.hpp"
#include "net/checkpoint.hpp"
#include "train/data_source.hpp"
#include "train/job.hpp"
#include "train/metrics.hpp"
#include "train/evaluate.hpp"
#include "train/generate.hpp"
#include "train/job_file.hpp"
#include "train/profile_cache.hpp"
#include "train/cli.hpp"
#include "actors/fit.hpp"
