// The plan of a run before it starts: how a configuration trains on a given number of ranks
// (micro-batch per GPU, micro-batches and images per step, steps per epoch, warmup and total
// steps, peak learning rate), for `train --plan_world_size N` and the manifests' renderer.
#pragma once

#include <cstdint>
#include <string>

#include "src/config/config.h"

namespace trainer {

// ImageNet-1k's training images: the plan's epoch for TFRecord data, which it does not read.
constexpr int64_t kImageNetTrainImages = 1281167;

// The plan of `config` on `world_size` ranks, as lines of text. `train_images`: images in a
// training epoch (0: what the data source makes, or ImageNet-1k's for TFRecords). Validates the
// configuration at that world size first: throws UserError, naming the key and the fix, for a
// run that could not start.
std::string describe_plan(Config config, int world_size, int64_t train_images = 0);

}  // namespace trainer
