// Training behaviour on the CPU with a small ResNet-18: the loss falls and accuracy beats chance
// on a learnable task; N steps + checkpoint + resume + N steps equals 2N steps exactly, also with
// the recipes' techniques on; a target top-1 stops the run; a global batch below batch_size
// shrinks the micro-batch; grad_scale multiplies the gradient before the optimizer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/user_error.h"
#include "data/datasets/generated_dataset.h"
#include "data/sources/memory_source.h"
#include "src/part_options.h"
#include "src/run/fit.h"
#include "src/sources.h"
#include "src/state/checkpoint.h"
#include "src/state/torch_pickle.h"
#include "src/state/weights.h"
#include "src/train/trainer.h"
#include "tests/support/small_run.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(Training, LossFallsAndAccuracyBeatsChance) {
  Config c = small_config("learn");
  c.epochs = 6;
  Sources sources = make_sources(c, torch::kCPU);
  Trainer trainer(trainer_options(c), torch::kCPU);
  fs::create_directories(c.output_dir);
  MetricsLog metrics(fs::path(c.output_dir) / "metrics.jsonl");
  const EvalResult before = trainer.evaluate(*sources.val);
  sources.train->start_epoch(0);
  const double first_loss = trainer.train_step(sources.train->next_batch(), 0.01).item<double>();
  FitResult result = fit(trainer, fit_options(c), *sources.train, sources.val.get(), metrics);
  EXPECT_LT(result.final_loss, 0.5 * first_loss);
  EXPECT_GT(result.final_eval.top1(), 60.0)
      << "chance is 25%; before training " << before.top1() << "%";
  EXPECT_EQ(result.final_eval.images, 40);

  std::ifstream in(fs::path(c.output_dir) / "metrics.jsonl");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"event\": \"train\""), std::string::npos);
  EXPECT_NE(text.str().find("\"event\": \"eval\""), std::string::npos);
}

// Trains `steps` steps in total (resuming from output_dir when it has a checkpoint).
TensorMap train_to(const Config& base, int64_t steps) {
  Config c = base;
  c.max_steps = steps;
  Sources sources = make_sources(c, torch::kCPU);
  Trainer trainer(trainer_options(c), torch::kCPU);
  MetricsLog metrics("");
  fit(trainer, fit_options(c), *sources.train, nullptr, metrics);
  return state_dict(*trainer.model());
}

// An epoch whose last step takes one image more than a batch (5 images in batches of 2: steps of
// 2 and 3), alone and accumulating (global_batch 4: micro-batches of 2, the last step one of 3):
// every step takes the batches the source deals, no more.
TEST(Training, ALastStepOfOneImageMoreIsOneBatch) {
  for (int64_t global_batch : {int64_t{0}, int64_t{4}}) {
    Config c = small_config("one-more-" + std::to_string(global_batch));
    c.generated_train_images = 5;
    c.batch_size = 2;
    c.global_batch = global_batch;
    c.epochs = 2;
    c.eval_every_epochs = 0;
    validate_config(c);
    Sources sources = make_sources(c, torch::kCPU, 0);
    Trainer trainer(trainer_options(c), torch::kCPU);
    MetricsLog metrics("");
    const FitResult result =
        fit(trainer, fit_options(c), *sources.train, sources.val.get(), metrics);
    EXPECT_EQ(result.steps, global_batch == 0 ? 4 : 2) << "global_batch " << global_batch;
  }
}

TEST(Training, ResumeContinuesExactly) {
  // 4 steps = 1 epoch and 1 batch: the resume lands mid-epoch, mid-warmup.
  Config straight = small_config("straight");
  const TensorMap expected = train_to(straight, 8);

  Config resumed = small_config("resumed");
  train_to(resumed, 4);
  ASSERT_TRUE(newest_checkpoint(fs::path(resumed.output_dir) / "checkpoints").has_value());
  const TensorMap actual = train_to(resumed, 8);

  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_TRUE(torch::equal(actual.at(name), tensor)) << name;
}

// Note [Fixed global batch]: a global_batch that leaves fewer images per rank than batch_size
// (a recipe on many nodes) shrinks the micro-batch to fit, and trains exactly as that batch_size.
// The events of one kind in a run's metrics.jsonl, as lines.
std::vector<std::string> metric_events(const Config& c, const std::string& kind) {
  std::ifstream in(fs::path(c.output_dir) / "metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"event\": \"" + kind + "\"") != std::string::npos) lines.push_back(line);
  return lines;
}

double top1_of(const std::string& event) {
  const auto at = event.find("\"top1\": ");
  return std::stod(event.substr(at + 8));
}

TEST(Training, TargetTop1StopsAtTheFirstEvaluationThatReachesIt) {
  Config c = small_config("target");
  c.epochs = 8;  // 24 steps
  c.target_top1 = 45;
  Sources sources = make_sources(c, torch::kCPU);
  FitResult result;
  {
    Trainer trainer(trainer_options(c), torch::kCPU);
    fs::create_directories(c.output_dir);
    MetricsLog metrics(fs::path(c.output_dir) / "metrics.jsonl");
    result = fit(trainer, fit_options(c), *sources.train, sources.val.get(), metrics);
  }
  ASSERT_TRUE(result.target_reached);
  EXPECT_LT(result.steps, 24);
  EXPECT_EQ(result.steps % 3, 0);  // at an epoch's end, where the evaluations are
  const auto evals = metric_events(c, "eval");
  ASSERT_EQ(static_cast<int64_t>(evals.size()), result.steps / 3);
  for (size_t i = 0; i + 1 < evals.size(); ++i) EXPECT_LT(top1_of(evals[i]), 45.0) << evals[i];
  EXPECT_GE(top1_of(evals.back()), 45.0);
  const auto target = metric_events(c, "target");
  ASSERT_EQ(target.size(), 1u);
  EXPECT_NE(target[0].find("\"seconds\": "), std::string::npos) << target[0];
  // A relaunch finds the run over: no step trained, no second time to accuracy.
  const size_t logged = metric_events(c, "train").size();
  Trainer again(trainer_options(c), torch::kCPU);
  MetricsLog metrics(fs::path(c.output_dir) / "metrics.jsonl");
  const FitResult relaunch = fit(again, fit_options(c), *sources.train, sources.val.get(), metrics);
  EXPECT_EQ(relaunch.steps, result.steps);
  EXPECT_EQ(metric_events(c, "train").size(), logged);
  EXPECT_EQ(metric_events(c, "target").size(), 1u);
}

TEST(Training, FlipEvaluationScoresAnImageAndItsMirrorAlike) {
  // A model trained a little, evaluated on 200 noise images with random labels, where its answers
  // are unsure, and on their mirrors. With eval_flip the two score the same, exactly (the same two
  // logits added); one view scores them differently.
  Config c = small_config("flip");
  c.epochs = 1;
  Sources sources = make_sources(c, torch::kCPU);
  Trainer trained(trainer_options(c), torch::kCPU);
  MetricsLog metrics("");
  fit(trained, fit_options(c), *sources.train, nullptr, metrics);
  torch::manual_seed(3);
  LabelledImages noise{torch::randint(0, 256, {200, c.image_size, c.image_size, 3}, torch::kByte),
                       torch::randint(0, c.num_classes, {200}, torch::kLong)};
  LabelledImages mirrored{noise.images.flip({2}).contiguous(), noise.labels};  // (N, H, W, 3): W
  MemorySourceOptions eval_options{c.batch_size, /*training=*/false};
  MemorySource plain(noise, eval_options), mirror(mirrored, eval_options);
  c.eval_flip = true;
  Trainer flip(trainer_options(c), torch::kCPU);
  load_state_dict(*flip.model(), state_dict(*trained.model()));
  const EvalResult a = flip.evaluate(plain), b = flip.evaluate(mirror);
  EXPECT_EQ(a.top1_correct, b.top1_correct);
  EXPECT_EQ(a.top5_correct, b.top5_correct);
  const EvalResult one_view = trained.evaluate(plain), other_view = trained.evaluate(mirror);
  EXPECT_NE(one_view.top1_correct, other_view.top1_correct);
}

TEST(Training, AGlobalBatchBelowBatchSizeShrinksTheMicroBatch) {
  Config shrunk = small_config("shrunk");
  shrunk.global_batch = 16;
  validate_config(shrunk);
  EXPECT_EQ(shrunk.micro_batch_size(), 16);
  EXPECT_EQ(shrunk.micro_batches(), 1);
  EXPECT_EQ(shrunk.images_per_step(), 16);
  Config plain = small_config("plain");
  plain.batch_size = 16;
  validate_config(plain);
  const TensorMap expected = train_to(plain, 4), actual = train_to(shrunk, 4);
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_TRUE(torch::equal(actual.at(name), tensor)) << name;
}

// The recipes' techniques all on (MixUp and CutMix draws, binary cross-entropy, BlurPool, EMA
// of the weights and BN statistics updated every other step, copying in the warmup): a resume
// mid-epoch still reproduces the uninterrupted run, EMA included.
TEST(Training, ResumeWithTheRecipeTechniquesContinuesExactly) {
  auto with_techniques = [](Config c) {
    c.mixup_alpha = 0.2;
    c.cutmix_alpha = 1.0;
    c.loss = LossKind::kBce;
    c.blurpool = true;
    c.ema_decay = 0.9;
    c.ema_every_steps = 2;
    c.ema_buffers = EmaBuffers::kAverage;
    c.ema_warmup_reset = true;  // the first epoch's updates copy, the resumed run's first averages
    validate_config(c);
    return c;
  };
  auto final_checkpoint = [](const Config& c) {
    return load_checkpoint(checkpoint_path(fs::path(c.output_dir) / "checkpoints", 8));
  };
  const Config straight = with_techniques(small_config("techniques_straight"));
  train_to(straight, 8);
  const Config resumed = with_techniques(small_config("techniques_resumed"));
  train_to(resumed, 5);  // an odd step: the next EMA update is the resumed run's first step
  train_to(resumed, 8);

  const Checkpoint expected = final_checkpoint(straight), actual = final_checkpoint(resumed);
  EXPECT_EQ(actual.architecture, "resnet18-blurpool");
  ASSERT_FALSE(expected.ema.empty());
  for (const TensorMap* part : {&expected.model, &expected.ema}) {
    const TensorMap& other = part == &expected.model ? actual.model : actual.ema;
    ASSERT_EQ(other.size(), part->size());
    for (const auto& [name, tensor] : *part)
      EXPECT_TRUE(torch::equal(other.at(name), tensor)) << name;
  }
  // The average trails the weights: it moved, but is not the trained model.
  EXPECT_FALSE(torch::equal(expected.ema.at("fc.weight"), expected.model.at("fc.weight")));
}

// grad_scale multiplies the step's gradient before the optimizer: one SGD step with grad_scale 2
// is one at twice the LR (no weight decay); under LARS, grad_scale 2 with weight decay wd moves
// the trust-ratio weights as grad_scale 1 with wd / 2, and BN and biases (no trust ratio) twice as
// far. The returned loss stays the batch's own.
TEST(Training, GradScaleMultipliesTheGradientBeforeTheOptimizer) {
  Config base = small_config("grad_scale");
  base.zero_init_residual = false;  // every parameter gets a gradient (LARS: a trust ratio)
  Sources sources = make_sources(base, torch::kCPU);
  sources.train->start_epoch(0);
  const Batch batch = sources.train->next_batch();
  struct Step {
    TensorMap before, after;
    double loss;
  };
  auto step = [&](OptimizerKind kind, double grad_scale, double weight_decay, double lr) {
    Config c = base;
    c.optimizer = kind;
    c.grad_scale = grad_scale;
    c.weight_decay = weight_decay;
    validate_config(c);
    Trainer trainer(trainer_options(c), torch::kCPU);
    Step out;
    for (const auto& [name, t] : state_dict(*trainer.model())) out.before[name] = t.clone();
    out.loss = trainer.train_step(batch, lr).item<double>();
    out.after = state_dict(*trainer.model());
    return out;
  };
  auto moved = [](const Step& s, const std::string& name) {
    return s.after.at(name) - s.before.at(name);
  };
  const Step sgd2 = step(OptimizerKind::kSgd, 2.0, 0.0, 0.05);
  const Step sgd1 = step(OptimizerKind::kSgd, 1.0, 0.0, 0.1);
  EXPECT_DOUBLE_EQ(sgd2.loss, sgd1.loss);
  const Step lars2 = step(OptimizerKind::kLars, 2.0, 0.02, 0.5);
  const Step lars1 = step(OptimizerKind::kLars, 1.0, 0.01, 0.5);
  int weights = 0, plain = 0;
  for (const auto& item : ResNet(ResNetOptions{18, 4})->named_parameters()) {
    const std::string& name = item.key();
    EXPECT_TRUE(torch::allclose(moved(sgd2, name), moved(sgd1, name), 1e-5, 1e-8)) << name;
    ASSERT_GT(moved(lars1, name).abs().max().item<double>(), 1e-5) << name;
    if (item.value().dim() > 1) {  // trust ratio: the same step
      ++weights;
      EXPECT_TRUE(torch::allclose(moved(lars2, name), moved(lars1, name), 1e-4, 1e-8))
          << name << " " << (moved(lars2, name) - moved(lars1, name)).abs().max().item<double>();
    } else {  // BN and biases: twice the step (BN gamma ~1: atol of a few ulp of 1)
      ++plain;
      EXPECT_TRUE(torch::allclose(moved(lars2, name), 2 * moved(lars1, name), 1e-4, 1e-6))
          << name << " "
          << (moved(lars2, name) - 2 * moved(lars1, name)).abs().max().item<double>();
    }
  }
  EXPECT_EQ(weights, 21);
  EXPECT_GT(plain, 0);
}

}  // namespace
}  // namespace trainer
