// Where a run starts and what it leaves to restart from (Note [Where a run starts] in
// src/run/start.cpp): rank 0 decides for every rank between the run's own newest checkpoint, a
// checkpoint file, init_weights and scratch; the chosen state is restored, with what changed since
// its run; checkpoints are written as the run goes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "src/train/lr_schedule.h"
#include "src/train/trainer.h"

namespace trainer {

// What the start, the checkpoints and an evaluation's choice of weights read of the
// configuration (made at the seam, src/part_options.cpp).
struct StartOptions {
  std::filesystem::path checkpoint_dir;  // <output_dir>/checkpoints
  std::string resume = "auto";           // auto | none | a checkpoint file
  std::string init_weights;              // a new run's weights; "": none
  // Started by an elastic launcher: the run's own newest checkpoint comes first whatever resume
  // says; restart_count is the agent's, for the log.
  bool elastic = false;
  int restart_count = 0;
  bool blurpool = false;  // the model's variant, which a weights file must be of
  int64_t num_classes = 0;
  bool classifier_only = false;  // a linear probe
  int64_t keep_checkpoints = 3;
  // This run's world size, images per step and LR per 256 images, logged against a
  // checkpoint's.
  int world_size = 1;
  int64_t images_per_step = 0;
  double base_lr = 0;
};

// Restores the newest state (resume), or the initial weights of a fresh start, and says where
// the run continues, and what changed since the checkpoint's run: world size, global batch, peak
// LR (Note [Elastic epoch order]). Collective.
Progress resume(Trainer& trainer, const StartOptions& options, int64_t samples_per_epoch,
                const LrSchedule& schedule);

// Collective: every rank takes rank 0's BN statistics; rank 0 alone writes the checkpoint of
// `at` and prunes the oldest beyond keep_checkpoints.
void save(Trainer& trainer, const StartOptions& options, const Progress& at,
          int64_t samples_per_epoch);

// The checkpoint an evaluate-only run without init_weights evaluates: `resume = FILE`, or the
// newest in output_dir as rank 0 sees it (collective).
std::filesystem::path checkpoint_to_evaluate(const StartOptions& options, ProcessGroup* group);

}  // namespace trainer
