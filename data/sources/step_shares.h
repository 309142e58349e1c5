// Which samples of a training epoch each rank trains at each step, at any world size. The
// rule every training source follows, so that a run resumed on another number of GPUs, or with
// another per-GPU batch, still trains every sample of the epoch exactly once.
#pragma once

#include <cstdint>
#include <vector>

namespace trainer {

// Note [Elastic epoch order]
// An epoch is one global order of its samples, a function of the seed and the epoch alone, never of
// the world size. The run's position is a count of samples into that order. Each step takes the
// next global_batch (= batch_size x world_size) positions; the epoch's last step takes what is left
// instead of dropping it (unless drop_last: Note [The last partial step]), and a remainder of a
// single sample joins the step before. The step's samples are sorted by sample id and dealt out in
// contiguous pieces, rank r the r-th: sizes differing by at most one, so a full step gives every
// rank batch_size samples; a short step with fewer than two samples per rank goes out two (or
// three) at a time and leaves the last ranks none. No rank ever trains a single sample alone: batch
// norm needs two values per channel, and a ResNet's last feature map is 1x1 at 32-pixel images.
// Sorted ids are storage order (TFRecord ids run file by file, record by record), so a rank's share
// is a few contiguous runs of the files, read in large blocks however many ranks there are. A run
// resumed at position p with another world size or batch size continues with the samples from p on:
// each is trained once per epoch whatever the resizes, and a resume with the same world size and
// batch size makes the same steps as a run that never stopped.

// Where an epoch of `samples`, started or resumed at `position`, ends: `samples`, or with
// `whole_steps_of` > 0 (drop_last) the end of its last whole step of that many samples.
int64_t epoch_end(int64_t samples, int64_t position, int64_t whole_steps_of);

// Note [The last partial step]
// drop_last (PyTorch's DataLoader, FFCV's loader, the MLPerf reference's drop_train_remainder):
// the epoch ends at its last whole step instead of training the samples left after it. The end is
// counted from where the epoch started or resumed, in steps of the run's images per step, so a
// run that never stops drops fewer than one step of the tail, and a run resumed at another batch
// drops fewer than one of its own steps: every sample is still trained at most once per epoch, and
// a resume with the same world size and batch makes the same steps as a run that never stopped.
// The functions below then see an epoch of `epoch_end` samples, whose steps are all whole.

// Samples in the step that starts at `position` of an epoch of `samples`.
int64_t step_samples(int64_t samples, int64_t position, int64_t global_batch);

// Steps from `position` to the end of an epoch of `samples`: the same on every rank.
int64_t steps_left(int64_t samples, int64_t position, int64_t global_batch);

// Rank `rank`'s piece of a step of `step_samples` sorted samples: [begin, begin + count).
struct Share {
  int64_t begin = 0;
  int64_t count = 0;
};
Share share_of(int64_t step_samples, int64_t batch_size, int rank, int world_size);

// This rank's samples, step after step, from `position` to the end of the epoch whose global
// order is `order`. Every step's share but the last holds batch_size samples; the last may hold
// fewer, none, or one more. `repetitions` k > 1: the order holds keys, each record's k copies
// side by side, and a full step deals them to k consecutive ranks (Note [Repeated augmentation] in
// data/sources/epoch_plan.h).
std::vector<int64_t> rank_samples(const std::vector<int64_t>& order, int64_t position,
                                  int64_t batch_size, int rank, int world_size,
                                  int64_t repetitions = 1);

}  // namespace trainer
