#include "src/run/evaluation.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "src/report/class_accuracy.h"
#include "src/report/input_preview.h"
#include "src/run/start.h"
#include "src/state/class_match.h"
#include "src/state/weights.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

// Classes with the lowest top-1 that evaluate_only logs.
constexpr size_t kWorstClassesLogged = 5;

}  // namespace

EvalResult run_eval(Trainer& trainer, BatchSource& val, int64_t epoch, int64_t step,
                    MetricsLog& metrics) {
  trainer.sync_buffers();
  EvalResult r = trainer.evaluate(val);
  MetricsLog::Fields fields = {{"epoch", epoch + 1},
                               {"step", step},
                               {"top1", r.top1()},
                               {"top5", r.top5()},
                               {"images", r.images}};
  std::string ema_text;
  if (trainer.has_ema()) {  // the average beside the weights, on the same images
    const EvalResult ema = trainer.evaluate(val, /*ema=*/true);
    ema_text = fmt::format(" | EMA top-1 {:.2f}% top-5 {:.2f}%", ema.top1(), ema.top5());
    fields.emplace_back("ema_top1", ema.top1());
    fields.emplace_back("ema_top5", ema.top5());
  }
  spdlog::info("eval epoch {} step {} | top-1 {:.2f}% | top-5 {:.2f}%{} | {} images", epoch + 1,
               step, r.top1(), r.top5(), ema_text, r.images);
  metrics.write("eval", fields);
  return r;
}

void write_preview(Trainer& trainer, const Batch& batch, const std::string& tag, int64_t step,
                   MetricsLog& metrics) {
  TensorBoardWriter* tensorboard = metrics.tensorboard();
  if (!tensorboard || batch.labels.size(0) == 0) return;
  constexpr int64_t kImages = 16, kColumns = 8;
  const int64_t n = std::min(kImages, batch.labels.size(0));
  at::NoGradGuard no_grad;
  const Picture picture =
      preview_grid(trainer.prepare_images(batch.images.narrow(0, 0, n)), batch.labels, n, kColumns);
  tensorboard->image(tag, step, picture.png, picture.height, picture.width);
}

void write_eval_preview(Trainer& trainer, BatchSource& val, int64_t step, MetricsLog& metrics) {
  if (!metrics.tensorboard()) return;
  val.start_epoch(0);
  if (val.batches_left() > 0) write_preview(trainer, val.next_batch(), "input/eval", step, metrics);
}

EvalResult evaluate_only(Trainer& trainer, const StartOptions& options, BatchSource& val,
                         MetricsLog& metrics) {
  const bool from_init = !options.init_weights.empty();
  const fs::path path =
      from_init ? fs::path(options.init_weights) : checkpoint_to_evaluate(options, trainer.group());
  const std::string key = from_init ? "init_weights" : "resume";
  const WeightsFile file = read_weights_file(path, key);
  check_variant(file, options.blurpool, key, /*strict=*/true);
  trainer.load_weights(file.tensors, key + " = '" + path.string() + "'",
                       /*keep_new_classifier=*/false);
  check_same_classes({file.classes, path.string()}, trainer.classes(), WeightsUse::kEvaluate);
  spdlog::info("evaluating {} in {}", file.description, path.string());
  if (trainer.is_rank0()) write_eval_preview(trainer, val, file.step, metrics);
  const EvalResult r = trainer.evaluate(val, /*ema=*/false, /*per_class=*/true);
  spdlog::info("evaluated {}: top-1 {:.2f}% | top-5 {:.2f}% | {} images", path.string(), r.top1(),
               r.top5(), r.images);
  // The names of the data, which the check above found equal to the weights' where both have them.
  const std::vector<ClassName>& names =
      trainer.classes().names.empty() ? file.classes : trainer.classes().names;
  spdlog::info(
      "lowest top-1 by class (index{}, top-1, right/images): {}",
      names.empty() ? "" : ", synset (words)",
      describe_classes(worst_classes(r.class_images, r.class_top1_correct, kWorstClassesLogged),
                       names));
  metrics.write("eval", {{"step", file.step},
                         {"top1", r.top1()},
                         {"top5", r.top5()},
                         {"images", r.images},
                         {"weights", path.string()}});
  metrics.flush();
  return r;
}

}  // namespace trainer
