// What the multi-rank tests share (tests/distributed/test_*.cpp, one binary run under mpirun and
// torchrun): the group every test runs in, a small configuration and per-rank batches.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "data/sources/batch_source.h"
#include "src/config/config.h"
#include "src/distributed/process_group.h"

namespace trainer {

// The launched group of the ranks, made by main (test_collectives.cpp) before any test runs.
extern ProcessGroup* g_group;

// A small run on the generated source at g_group's world size: ResNet-18, 32 px, batch 8,
// 100 training images (uneven: not a multiple of ranks x batch), 41 held out.
Config dist_config();

// A batch of 4 images of 32 px that differs per `index` (e.g. per rank).
Batch batch_for(int index);

// This rank's GPU, with the group's NCCL communicator made on it; none when any rank of the node
// has no GPU of its own (every rank then skips alike, so no collective is left waiting).
std::optional<torch::Device> rank_gpu_with_nccl();

}  // namespace trainer
