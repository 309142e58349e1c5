// Where a run starts and what it leaves to restart from (Note [Where a run starts] in
// src/run_start.cpp): rank 0 decides for every rank between the run's own newest checkpoint, a
// checkpoint file, init_weights and scratch; the chosen state is restored, with what changed since
// its run; checkpoints are written as the run goes.
#pragma once

#include <cstdint>
#include <filesystem>

#include "src/config.h"
#include "src/train/lr_schedule.h"
#include "src/train/trainer.h"

namespace trainer {

// <output_dir>/checkpoints.
std::filesystem::path checkpoint_dir(const Config& config);

// Restores the newest state (resume), or the initial weights of a fresh start, and says where
// the run continues, and what changed since the checkpoint's run: world size, global batch, peak
// LR (Note [Elastic epoch order]). Collective.
Progress resume(Trainer& trainer, const Config& config, int64_t samples_per_epoch,
                const LrSchedule& schedule);

// Collective: every rank takes rank 0's BN statistics; rank 0 alone writes the checkpoint of
// `at` and prunes the oldest beyond keep_checkpoints.
void save(Trainer& trainer, const Config& config, const Progress& at, int64_t samples_per_epoch);

// The checkpoint an evaluate-only run without init_weights evaluates: `resume = FILE`, or the
// newest in output_dir as rank 0 sees it (collective).
std::filesystem::path checkpoint_to_evaluate(const Config& config, ProcessGroup* group);

}  // namespace trainer
