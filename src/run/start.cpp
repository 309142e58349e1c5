#include "src/run/start.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/user_error.h"
#include "src/state/checkpoint.h"
#include "src/state/class_match.h"
#include "src/state/weights.h"

namespace trainer {
namespace fs = std::filesystem;

namespace {

// Now in UTC as 20261123T203800Z: sorts by time, and is a valid file name everywhere.
std::string utc_time_for_file_name() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

// Note [Where a run starts]
// Rank 0 decides for every rank, so that ranks whose output folders differ (node-local disks, a
// checkpoint still being written) cannot resume from different steps; the others check that they
// see the file it chose. The run's own newest checkpoint in output_dir comes first with
// `resume = auto`, and under an elastic launcher whatever `resume` says: there any start may be a
// later round of a running job (a pod that joins has a restart count of 0 like a first start).
// Otherwise `resume = none` starts from scratch and `resume = FILE` from that file. Such a fresh
// start first moves aside the checkpoints in output_dir of steps beyond its own: kept, the next
// `auto` start would resume from those rather than the new run's, and pruning (by step) would
// delete the new run's checkpoints instead of theirs.
enum class StartKind : int64_t { kScratch, kOwnCheckpoint, kFile };

// Rank 0: moves the checkpoints in `dir` past `step` to a folder beside it.
void move_aside_checkpoints_after(const fs::path& dir, int64_t step, const std::string& why) {
  std::vector<fs::path> later;
  for (const fs::path& path : list_checkpoints(dir))
    if (checkpoint_step(path) > step) later.push_back(path);
  if (later.empty()) return;
  const fs::path aside = dir.string() + "-before-" + utc_time_for_file_name();
  fs::create_directories(aside);
  for (const fs::path& path : later) fs::rename(path, aside / path.filename());
  spdlog::warn("{}: {} checkpoint(s) of an earlier run in {}, up to {}, moved to {}", why,
               later.size(), dir.string(), later.back().filename().string(), aside.string());
}

// Rank 0's decision: what to start from, and the step of the own checkpoint.
std::pair<StartKind, int64_t> decide_start(const StartOptions& options) {
  const fs::path dir = options.checkpoint_dir;
  const std::optional<fs::path> newest = newest_checkpoint(dir);
  if (newest && (options.resume == "auto" || options.elastic))
    return {StartKind::kOwnCheckpoint, checkpoint_step(*newest)};
  if (options.resume == "none" || options.resume == "auto") {
    move_aside_checkpoints_after(dir, 0, "resume = " + options.resume + " starts from scratch");
    return {StartKind::kScratch, 0};
  }
  USER_CHECK(fs::is_regular_file(options.resume), "resume = '", options.resume,
             "' is not a checkpoint file. Fix: resume = auto (newest in output_dir), none, or ",
             "the path of a checkpoint-*.pt");
  const fs::path file(options.resume);
  const int64_t step = is_checkpoint_file_name(file) ? checkpoint_step(file) : 0;
  move_aside_checkpoints_after(dir, step, "resume = " + options.resume);
  return {StartKind::kFile, 0};
}

// The checkpoint every rank resumes from (Note [Where a run starts]); collective.
std::optional<fs::path> resume_path(const StartOptions& options, ProcessGroup* group) {
  const bool rank0 = !group || group->rank() == 0;
  at::Tensor decision = at::zeros({2}, at::kLong);
  if (rank0) {
    const auto [kind, step] = decide_start(options);
    decision[0] = static_cast<int64_t>(kind);
    decision[1] = step;
  }
  if (group) group->broadcast_(decision, /*root=*/0);
  const auto kind = static_cast<StartKind>(decision[0].item<int64_t>());
  if (kind == StartKind::kScratch) return std::nullopt;
  const fs::path path = kind == StartKind::kFile
                            ? fs::path(options.resume)
                            : checkpoint_path(options.checkpoint_dir, decision[1].item<int64_t>());
  USER_CHECK(fs::is_regular_file(path), "rank 0 resumes from ", path.string(),
             ", which this rank does not see. Fix: output_dir (and resume) must be on a file ",
             "system every rank shares, e.g. /fsx/runs");
  return path;
}

// A fresh start from init_weights, when set: its weights, with the optimizer and schedule new.
void load_init_weights(Trainer& trainer, const StartOptions& options) {
  if (options.init_weights.empty()) return;
  const WeightsFile file = read_weights_file(options.init_weights, "init_weights");
  check_variant(file, options.blurpool, "init_weights", /*strict=*/false);
  const bool new_classifier = trainer.load_weights(
      file.tensors, "init_weights = '" + options.init_weights + "'", /*keep_new_classifier=*/true);
  // A new classifier learns the data's classes from scratch; a kept one must mean the same ones.
  if (!new_classifier)
    check_same_classes({file.classes, options.init_weights}, trainer.classes(),
                       WeightsUse::kInitialise);
  spdlog::info("starting from {} in {}{}", file.description, options.init_weights,
               new_classifier ? "; the classifier is re-initialised for num_classes = " +
                                    std::to_string(options.num_classes) + " (the file's has " +
                                    std::to_string(file.tensors.at("fc.weight").size(0)) + ")"
                              : "");
}

}  // namespace

Progress resume(Trainer& trainer, const StartOptions& options, int64_t samples_per_epoch,
                const LrSchedule& schedule) {
  const std::optional<fs::path> path = resume_path(options, trainer.group());
  if (options.classifier_only)
    spdlog::info("linear probe: only the classifier trains; the other layers stay as loaded");
  if (!path) {
    load_init_weights(trainer, options);
    return {};
  }
  const Checkpoint checkpoint = load_checkpoint(*path);
  trainer.restore(checkpoint);
  check_same_classes({checkpoint.classes, path->string()}, trainer.classes(), WeightsUse::kResume);
  Progress at = checkpoint.progress;
  spdlog::info("resumed from {}: epoch {}, image {} of {}, step {}{}{}", path->string(),
               at.epoch + 1, at.samples_in_epoch, samples_per_epoch, at.step,
               options.restart_count > 0
                   ? " (restart " + std::to_string(options.restart_count) + " by the elastic agent)"
                   : "",
               options.init_weights.empty() ? "" : " (init_weights only starts a new run)");
  if (checkpoint.world_size != options.world_size ||
      checkpoint.global_batch != options.images_per_step)
    spdlog::info(
        "resized: world size {} -> {}, global batch {} -> {}, peak lr {:.5f} -> {:.5f}",
        checkpoint.world_size, options.world_size, checkpoint.global_batch, options.images_per_step,
        options.base_lr * static_cast<double>(checkpoint.global_batch) / 256.0, schedule.peak());
  if (checkpoint.samples_per_epoch != samples_per_epoch) {
    spdlog::warn(
        "the training data holds {} images, the checkpoint's run had {}: the rest of epoch {} is "
        "drawn from a different order, so some images may be trained twice or not at all",
        samples_per_epoch, checkpoint.samples_per_epoch, at.epoch + 1);
    if (at.samples_in_epoch >= samples_per_epoch) at = {at.step, at.epoch + 1, 0};
  }
  return at;
}

void save(Trainer& trainer, const StartOptions& options, const Progress& at,
          int64_t samples_per_epoch) {
  trainer.sync_buffers();
  if (!trainer.is_rank0()) return;
  const fs::path path = checkpoint_path(options.checkpoint_dir, at.step);
  Checkpoint checkpoint = trainer.checkpoint(at);
  checkpoint.samples_per_epoch = samples_per_epoch;
  save_checkpoint(checkpoint, path);
  prune_checkpoints(options.checkpoint_dir, options.keep_checkpoints);
  spdlog::info("checkpoint {}", path.string());
}

fs::path checkpoint_to_evaluate(const StartOptions& options, ProcessGroup* group) {
  if (options.resume != "auto" && options.resume != "none") return options.resume;
  at::Tensor step = at::full({1}, -1, at::kLong);
  if ((!group || group->rank() == 0) && options.resume == "auto")
    if (const auto newest = newest_checkpoint(options.checkpoint_dir))
      step[0] = checkpoint_step(*newest);
  if (group) group->broadcast_(step, /*root=*/0);
  USER_CHECK(step[0].item<int64_t>() >= 0, "evaluate_only has no weights: init_weights is unset ",
             "and ",
             options.resume == "none" ? "resume = none"
                                      : "no checkpoint is in " + options.checkpoint_dir.string(),
             ". Fix: init_weights = FILE (a state dict or a checkpoint), or resume = a checkpoint");
  return checkpoint_path(options.checkpoint_dir, step[0].item<int64_t>());
}

}  // namespace trainer
