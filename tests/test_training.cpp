// Training behaviour on the CPU with a small ResNet-18: the loss falls and accuracy beats chance
// on a learnable task; N steps + checkpoint + resume + N steps equals 2N steps exactly;
// checkpoints round-trip, rotate, leave no unfinished writes behind, and bad ones are clear errors;
// and the same exact resume with the recipes' techniques on.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/check.h"
#include "data/datasets/generated_dataset.h"
#include "data/sources/memory_source.h"
#include "src/fit.h"
#include "src/part_options.h"
#include "src/sources.h"
#include "src/state/checkpoint.h"
#include "src/state/torch_pickle.h"
#include "src/state/weights.h"
#include "src/train/trainer.h"
#include "tests/temp_dir.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

// The folder of this program's checkpoints and logs, removed when it ends.
const fs::path& scratch() {
  static const testing::TempDir dir;
  return dir.path();
}

Config small_config(const std::string& name) {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 96;  // 3 steps per epoch of 32
  c.generated_val_images = 40;
  c.image_size = 32;
  c.batch_size = 32;
  c.epochs = 4;
  c.warmup_epochs = 1;
  c.base_lr = 0.4;
  c.weight_decay = 5e-5;
  c.label_smoothing = 0.0;
  c.log_every_steps = 2;
  c.resume = "auto";
  c.output_dir = (scratch() / name).string();
  validate_config(c);
  return c;
}

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
  FitResult result = fit(trainer, c, *sources.train, sources.val.get(), metrics);
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
  fit(trainer, c, *sources.train, nullptr, metrics);
  return state_dict(*trainer.model());
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
    result = fit(trainer, c, *sources.train, sources.val.get(), metrics);
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
  const FitResult relaunch = fit(again, c, *sources.train, sources.val.get(), metrics);
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
  fit(trained, c, *sources.train, nullptr, metrics);
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

TEST(Checkpoint, RoundTripsEveryField) {
  Config c = small_config("roundtrip");
  Trainer trainer(trainer_options(c), torch::kCPU);
  Checkpoint saved = trainer.checkpoint(Progress{/*step=*/7, /*epoch=*/2, /*samples_in_epoch=*/24,
                                                 /*eval_pending=*/true, /*target_reached=*/true});
  saved.samples_per_epoch = 64;
  const fs::path path = fs::path(c.output_dir) / "one.pt";
  save_checkpoint(saved, path);
  Checkpoint loaded = load_checkpoint(path);
  EXPECT_EQ(loaded.progress.step, 7);
  EXPECT_EQ(loaded.progress.epoch, 2);
  EXPECT_EQ(loaded.progress.samples_in_epoch, 24);
  EXPECT_TRUE(loaded.progress.eval_pending);
  EXPECT_TRUE(loaded.progress.target_reached);
  EXPECT_EQ(loaded.world_size, 1);
  EXPECT_EQ(loaded.global_batch, c.batch_size);
  EXPECT_EQ(loaded.samples_per_epoch, 64);
  EXPECT_EQ(loaded.config, saved.config);
  EXPECT_EQ(loaded.loss_scale, saved.loss_scale);
  ASSERT_EQ(loaded.model.size(), saved.model.size());
  for (const auto& [name, tensor] : saved.model)
    EXPECT_TRUE(torch::equal(loaded.model.at(name), tensor)) << name;
  EXPECT_EQ(loaded.optimizer.size(), saved.optimizer.size());
}

TEST(Checkpoint, KeepsTheNewestK) {
  const fs::path dir = scratch() / "rotate";
  Checkpoint empty;
  for (int64_t step : {5, 10, 100, 20}) save_checkpoint(empty, checkpoint_path(dir, step));
  prune_checkpoints(dir, 2);
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 100));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 20)));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 10)));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 5)));
  EXPECT_FALSE(newest_checkpoint(dir / "missing").has_value());
}

TEST(Checkpoint, UnfinishedWritesAreRemovedAndCheckpointsKept) {
  const fs::path dir = scratch() / "unfinished";
  save_checkpoint(Checkpoint{}, checkpoint_path(dir, 20));
  const fs::path killed = checkpoint_path(dir, 30).string() + ".tmp.4242";  // writer killed
  std::ofstream(killed) << "half a checkpoint";
  std::ofstream(dir / "notes.txt") << "not ours";
  EXPECT_EQ(remove_unfinished_checkpoints(dir), 1);
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 20)));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 20));
  EXPECT_EQ(remove_unfinished_checkpoints(dir / "missing"), 0);
}

TEST(Checkpoint, CorruptOrMismatchedCheckpointsAreUserErrors) {
  const fs::path path = scratch() / "corrupt.pt";
  std::ofstream(path) << "not a checkpoint";
  EXPECT_THROW(load_checkpoint(path), UserError);
  EXPECT_THROW(load_checkpoint("/nonexistent/checkpoint.pt"), UserError);

  ResNet resnet18(ResNetOptions{18, 4, false});
  ResNet resnet34(ResNetOptions{34, 4, false});
  EXPECT_THROW(load_state_dict(*resnet34, state_dict(*resnet18)), UserError);
  ResNet other_classes(ResNetOptions{18, 5, false});
  EXPECT_THROW(load_state_dict(*other_classes, state_dict(*resnet18)), UserError);
}

// The UserError message of `read`, or "" when it succeeds.
template <typename Read>
std::string user_error_of(Read read) {
  try {
    read();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A torch.save file of {"w": a float tensor of `size` elements over a storage the pickle says
// holds `numel`}, whose record holds 4 floats: torch.save's layout, written by hand.
void write_crafted_weights(const fs::path& path, int32_t numel, int32_t size) {
  auto int32 = [](int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto text = [&](const std::string& s) { return "X" + int32(int32_t(s.size())) + s; };
  const std::string pickle = "\x80\x02}" + text("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" +
                             text("storage") + "ctorch\nFloatStorage\n" + text("0") + text("cpu") +
                             "J" + int32(numel) + "tQ" + std::string("K\0J", 3) + int32(size) +
                             "\x85K\x01\x85\x89NtRs.";
  const float values[4] = {1, 2, 3, 4};
  caffe2::serialize::PyTorchStreamWriter writer(path.string());
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord("data/0", values, sizeof(values));
  writer.writeEndOfFile();
}

TEST(Weights, TensorsAndZipEntriesMustLieInsideTheFile) {
  const fs::path path = scratch() / "crafted.pth";
  write_crafted_weights(path, 4, 4);
  const WeightsFile normal = read_weights_file(path, "init_weights");
  EXPECT_TRUE(normal.tensors.at("w").equal(at::arange(1, 5, at::kFloat)));
  // A storage claiming 2^31 - 1 floats (8 GB) over 16 stored bytes: LibTorch would view it.
  write_crafted_weights(path, INT32_MAX, 4);
  std::string error = user_error_of([&] { read_weights_file(path, "init_weights"); });
  EXPECT_NE(error.find("claims 8589934588 bytes but the file holds 16"), std::string::npos)
      << error;
  // A shape of 2^31 - 1 elements over a storage of 4.
  write_crafted_weights(path, 4, INT32_MAX);
  error = user_error_of([&] { read_weights_file(path, "init_weights"); });
  EXPECT_NE(error.find("reaches past its storage of 16 bytes"), std::string::npos) << error;
  // A zip entry claiming 2 GB: refused before getRecord allocates it.
  write_crafted_weights(path, 4, 4);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t entry = bytes.find("/data/0", bytes.find("PK\x01\x02"));
  const size_t header = bytes.rfind("PK\x01\x02", entry);
  ASSERT_NE(header, std::string::npos);
  for (size_t at : {header + 20, header + 24}) std::memcpy(&bytes[at], "\xf0\xff\xff\x7f", 4);
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_THROW(read_weights_file(path, "init_weights"), UserError);
}

// Found by tests/fuzz/fuzz_torch_save: LibTorch's unpickler allocates what a damaged field claims.
TEST(Weights, PickleFieldsMustFitThePickle) {
  const fs::path path = scratch() / "crafted-pickle.pth";
  auto error_for = [&](const std::string& pickle) {
    {
      caffe2::serialize::PyTorchStreamWriter writer(path.string());
      writer.writeRecord("data.pkl", pickle.data(), pickle.size());
      writer.writeEndOfFile();
    }
    return user_error_of([&] { read_weights_file(path, "init_weights"); });
  };
  // A string whose 4-byte length claims 2 GB in a pickle of 11 bytes.
  std::string error = error_for(std::string("\x80\x02}X\x00\x00\x00\x7fws.", 11));
  EXPECT_NE(error.find("in its pickle (data.pkl), the opcode at byte 3 claims more bytes than its "
                       "11"),
            std::string::npos)
      << error;
  // A memo PUT at index 2^31 - 1: the unpickler would grow its memo to 32 GB.
  error = error_for(std::string("\x80\x02}r\xff\xff\xff\x7f.", 9));
  EXPECT_NE(error.find("the memo index at byte 3 is over any its 9 bytes can hold"),
            std::string::npos)
      << error;
}

TEST(Weights, FilesOverTheSizeLimitAreRefusedBeforeReading) {
  const fs::path weights = scratch() / "huge.pth", checkpoint = scratch() / "huge.pt";
  std::ofstream(weights) << "PK\x03\x04";
  fs::resize_file(weights, kMaxWeightsFileBytes + 1);  // sparse: nothing written
  std::string error = user_error_of([&] { read_weights_file(weights, "init_weights"); });
  EXPECT_NE(error.find("2147483649 bytes, over the limit of 2147483648"), std::string::npos)
      << error;
  std::ofstream(checkpoint) << "PK\x03\x04";
  fs::resize_file(checkpoint, kMaxCheckpointBytes + 1);
  error = user_error_of([&] { load_checkpoint(checkpoint); });
  EXPECT_NE(error.find("4294967297 bytes, over the limit of 4294967296"), std::string::npos)
      << error;
  EXPECT_NE(error.find(checkpoint.string()), std::string::npos) << error;
}

// When the step is recorded as a CUDA graph (the schedule is host logic, the same on any
// device): after 3 eager steps of one shape; the recorded shape then replays; a short last step
// (seen once) runs eagerly without losing the graph; a new image size that lasts (progressive
// resizing) is recorded after its own warm-up; a different loss weight is a different step.
TEST(Training, CudaGraphRecordsAShapeAfterItsWarmUpAndKeepsItThroughOneOffSteps) {
  using Action = CaptureSchedule::Action;
  auto shape = [](int64_t batch, int64_t size, double weight = 1.0) {
    return StepShape::of(torch::empty({batch, 3, size, size}), torch::empty({batch}, torch::kLong),
                         weight);
  };
  CaptureSchedule schedule(3);
  std::vector<Action> actions;
  for (int i = 0; i < 5; ++i) actions.push_back(schedule.next(shape(32, 160)));
  actions.push_back(schedule.next(shape(20, 160)));       // a short last step
  actions.push_back(schedule.next(shape(32, 160)));       // the next epoch
  actions.push_back(schedule.next(shape(32, 160, 0.5)));  // the same images, another weight
  for (int i = 0; i < 5; ++i) actions.push_back(schedule.next(shape(32, 192)));  // a new size
  actions.push_back(schedule.next(shape(32, 160)));  // the old size: no longer recorded
  const std::vector<Action> expected = {
      Action::kEager, Action::kEager,   Action::kEager,  Action::kCapture, Action::kReplay,
      Action::kEager, Action::kReplay,  Action::kEager,  Action::kEager,   Action::kEager,
      Action::kEager, Action::kCapture, Action::kReplay, Action::kEager};
  ASSERT_EQ(actions.size(), expected.size());
  for (size_t i = 0; i < actions.size(); ++i)
    EXPECT_EQ(static_cast<int>(actions[i]), static_cast<int>(expected[i])) << "step " << i;
}

// A graph released to make room for an eager step (an epoch's short last step on a card without
// room for both) is recorded again at the next step of its shape, without a second warm-up; a
// shape never recorded still warms up first.
TEST(Training, CudaGraphReleasedForAnEagerStepIsRecordedAgainWithoutWarmUp) {
  using Action = CaptureSchedule::Action;
  auto shape = [](int64_t batch, int64_t size) {
    return StepShape::of(torch::empty({batch, 3, size, size}), torch::empty({batch}, torch::kLong),
                         1.0);
  };
  CaptureSchedule schedule(3);
  std::vector<Action> actions;
  for (int i = 0; i < 5; ++i) actions.push_back(schedule.next(shape(256, 224)));
  actions.push_back(schedule.next(shape(200, 224)));  // a short last step...
  schedule.release();                                 // ...that does not fit beside the graph
  for (int i = 0; i < 2; ++i) actions.push_back(schedule.next(shape(256, 224)));
  actions.push_back(schedule.next(shape(256, 256)));  // a new size, while recorded: eager
  schedule.release();
  for (int i = 0; i < 4; ++i) actions.push_back(schedule.next(shape(256, 256)));
  const std::vector<Action> expected = {
      Action::kEager, Action::kEager,   Action::kEager,  Action::kCapture, Action::kReplay,
      Action::kEager, Action::kCapture, Action::kReplay, Action::kEager,   Action::kEager,
      Action::kEager, Action::kCapture, Action::kReplay};
  ASSERT_EQ(actions.size(), expected.size());
  for (size_t i = 0; i < actions.size(); ++i)
    EXPECT_EQ(static_cast<int>(actions[i]), static_cast<int>(expected[i])) << "step " << i;
}

TEST(Training, CudaGraphNeverRecordsAnEpochsShortStep) {
  // Each epoch's last step is short, once an epoch: it never warms up in a row, however many
  // epochs see it, and the full step's recording stays.
  using Action = CaptureSchedule::Action;
  auto shape = [](int64_t batch) {
    return StepShape::of(torch::empty({batch, 3, 224, 224}), torch::empty({batch}, torch::kLong),
                         1.0);
  };
  CaptureSchedule schedule(3);
  int full_captures = 0, short_captures = 0, eager_full_steps = 0;
  for (int epoch = 0; epoch < 8; ++epoch)
    for (int64_t batch : {256, 256, 256, 256, 256, 256, 100}) {
      const Action action = schedule.next(shape(batch));
      const bool full = batch == 256;
      if (action == Action::kCapture) ++(full ? full_captures : short_captures);
      if (action == Action::kEager && full) ++eager_full_steps;
    }
  EXPECT_EQ(full_captures, 1);
  EXPECT_EQ(short_captures, 0);
  EXPECT_EQ(eager_full_steps, 3);  // the first epoch's warm-up only
}

// Whether an eager step fits beside the graph, at the shipped setting this matters for: 256
// images of 224 px in fp16 on a 16 GB V100, where the recorded step holds most of the card.
TEST(Training, EagerStepBesideTheGraphIsEstimatedFromTheRecordingScaledByItsImages) {
  const int64_t GiB = int64_t{1} << 30;
  const int64_t graph = 11 * GiB, free_beside = 4 * GiB;  // of 16 GB, with weights and buffers
  const int64_t recorded = 256 * 3 * 224 * 224;
  const double margin = StepGraphOptions{}.memory_margin;
  EXPECT_GT(eager_step_bytes(graph, 200 * 3 * 224 * 224, recorded, margin), free_beside);
  EXPECT_LE(eager_step_bytes(graph, 10 * 3 * 224 * 224, recorded, margin), free_beside);
  EXPECT_EQ(eager_step_bytes(graph, recorded / 2, recorded, 1.0), graph / 2);
  // Progressive resizing from 160 to 192 px: 1.44x the pixels, 1.44x the activations.
  EXPECT_EQ(eager_step_bytes(100 * 160 * 160, 192 * 192, 160 * 160, 1.0), 100 * 192 * 192);
  // No eager step beside the graph at all: more than any card has.
  EXPECT_EQ(eager_step_bytes(0, 1, 1, std::numeric_limits<double>::infinity()),
            std::numeric_limits<int64_t>::max());
}

// A shipped recipe on one P3 node (8 GPUs) with the graph asked for: DLE's global_batch of 2,048
// is one batch of 256 per GPU, and the graph records its steps; FFCV's 4,096 is two micro-batches,
// which the graph does not record, so training steps eagerly. A benchmark steps one batch at a
// time and keeps the graph.
Config recipe_on_a_p3_node(const std::string& recipe) {
  const std::string path = std::string(TRAINER_CONFIG_DIR) + "/recipes/" + recipe;
  const std::vector<const char*> argv = {"train", "--config", path.c_str(), "--cuda_graph", "true"};
  Config c = parse_command_line(static_cast<int>(argv.size()), argv.data())->config;
  c.world_size = 8;
  validate_config(c);
  return c;
}

TEST(Training, CudaGraphIsOnUnlessAStepAccumulatesMicroBatches) {
  const Config dle = recipe_on_a_p3_node("dle-90-epochs.toml");
  ASSERT_EQ(dle.micro_batches(), 1);
  EXPECT_TRUE(trainer_options(dle).cuda_graph);
  Config ffcv = recipe_on_a_p3_node("ffcv-16-epochs.toml");
  ASSERT_EQ(ffcv.micro_batches(), 2);
  EXPECT_FALSE(trainer_options(ffcv).cuda_graph);
  ffcv.benchmark = true;
  EXPECT_TRUE(trainer_options(ffcv).cuda_graph);
  ffcv.cuda_graph = false;
  EXPECT_FALSE(trainer_options(ffcv).cuda_graph);
}

TEST(Training, CudaGraphGoesOnEveryRankWhenOneRankHasNoRoom) {
  // The ranks' graphs hold their gradient all-reduces, which NCCL needs recorded and replayed
  // alike on every rank: each rank votes its own want of room, and one want releases them all.
  std::vector<bool> votes;
  const auto another_rank_short = [&](bool mine) {
    votes.push_back(mine);
    return true;
  };
  const auto every_rank_as_this = [&](bool mine) {
    votes.push_back(mine);
    return mine;
  };
  EXPECT_TRUE(graph_must_go(1, 10, another_rank_short));  // fits here, not there
  EXPECT_FALSE(graph_must_go(1, 10, every_rank_as_this));
  EXPECT_TRUE(graph_must_go(20, 10, every_rank_as_this));
  EXPECT_TRUE(graph_must_go(0, 0, another_rank_short));  // a rank with no work votes too
  EXPECT_EQ(votes, (std::vector<bool>{false, false, true, false}));
  // Alone, the rank decides by itself.
  EXPECT_TRUE(graph_must_go(20, 10, {}));
  EXPECT_FALSE(graph_must_go(10, 10, {}));
}

}  // namespace
}  // namespace trainer
