// Builds the training and evaluation batch sources that the configuration names.
#pragma once

#include <c10/core/Device.h>

#include <memory>

#include "data/batch_source.h"
#include "src/config.h"

namespace trainer {

struct Sources {
  std::unique_ptr<BatchSource> train;
  std::unique_ptr<BatchSource> val;  // null when the source has no held-out split (synthetic)
};

Sources make_sources(const Config& config, c10::Device device);

}  // namespace trainer
