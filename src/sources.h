// Builds the training and evaluation batch sources that the configuration names.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <optional>

#include "data/sources/batch_source.h"
#include "data/sources/image_size_schedule.h"
#include "src/config/config.h"

namespace trainer {

struct Sources {
  std::unique_ptr<BatchSource> train;  // null in an evaluate-only run
  std::unique_ptr<BatchSource> val;    // null when the source has no held-out split (synthetic)
};

// `rank` is this process's index among config.world_size; each rank gets its own part of every
// epoch and the same number of training batches. `local_size`: the ranks on this node, which
// share its cores (the decode threads' default).
Sources make_sources(const Config& config, c10::Device device, int rank = 0, int local_size = 1);

// The training crop of each epoch under progressive resizing; nullopt: image_size throughout.
std::optional<ImageSizeSchedule> progressive_image_sizes(const Config& config);

// The training crop of `epoch` (0-based), pixels: what the training source yields that epoch.
int64_t train_image_size(const Config& config, int64_t epoch);

// TFRecord data (a no-op for other sources): builds the missing index files, this rank scanning
// its share of the files among the `local_size` ranks of its node, so each file is scanned once
// per node. Every rank calls it and then waits for the others (a barrier) before make_sources,
// which then reads the indexes instead of scanning.
void build_tfrecord_indexes(const Config& config, int local_rank, int local_size);

}  // namespace trainer
