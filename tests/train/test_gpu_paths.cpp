// GPU paths: the normalisation kernel against the CPU reference, bf16 and fp16 training steps in
// channels_last, fp16 loss scaling on real overflow, and the step as a CUDA graph against the
// eager step, released and recorded again to make room for an eager step. Skipped, with the
// reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>
#include <limits>

#include "data/transforms/device_input.h"
#include "src/part_options.h"
#include "src/run/fit.h"
#include "src/sources.h"
#include "src/state/checkpoint.h"
#include "src/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace trainer {
namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

Config gpu_config(Precision precision) {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 256;
  c.generated_val_images = 64;
  c.image_size = 64;
  c.batch_size = 32;
  c.epochs = 4;
  c.warmup_epochs = 1;
  c.base_lr = 0.4;
  c.precision = precision;
  c.device = DeviceChoice::kCuda;
  validate_config(c);
  return c;
}

TEST_F(Gpu, NormalizeKernelMatchesCpuReference) {
  auto images = torch::randint(0, 256, {3, 17, 19, 3}, torch::kByte);
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    auto cpu = normalize_images(images, torch::kFloat, c10::MemoryFormat::Contiguous);
    auto gpu = normalize_images(images.cuda(), dtype, c10::MemoryFormat::ChannelsLast);
    EXPECT_TRUE(gpu.is_contiguous(c10::MemoryFormat::ChannelsLast));
    EXPECT_EQ(gpu.scalar_type(), dtype);
    const double tol = dtype == torch::kFloat ? 1e-6 : 2e-2;
    EXPECT_TRUE(torch::allclose(gpu.cpu().to(torch::kFloat), cpu, tol, tol)) << dtype;
  }
}

void expect_learns(Precision precision) {
  Config c = gpu_config(precision);
  Sources sources = make_sources(c, torch::Device(torch::kCUDA, 0));
  Trainer trainer(trainer_options(c), torch::Device(torch::kCUDA, 0));
  for (const auto& p : trainer.model()->parameters())
    if (p.dim() == 4) EXPECT_TRUE(p.is_contiguous(c10::MemoryFormat::ChannelsLast));
  std::vector<double> losses;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    sources.train->start_epoch(epoch);
    while (sources.train->batches_left() > 0)
      losses.push_back(trainer.train_step(sources.train->next_batch(), 0.05).item<double>());
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << name_of(precision);
  EXPECT_GT(trainer.evaluate(*sources.val).top1(), 60.0) << name_of(precision);
}

TEST_F(Gpu, Bf16StepsLearnInChannelsLast) { expect_learns(Precision::kBf16); }

TEST_F(Gpu, Fp16StepsLearnInChannelsLast) { expect_learns(Precision::kFp16); }

TEST_F(Gpu, Fp16OverflowSkipsStepsAndHalvesTheScale) {
  Config c = gpu_config(Precision::kFp16);
  c.loss_scale_init = 1e30;  // fp16 gradients overflow at this scale
  Sources sources = make_sources(c, torch::Device(torch::kCUDA, 0));
  Trainer trainer(trainer_options(c), torch::Device(torch::kCUDA, 0));
  auto before = trainer.model()->named_parameters()["conv1.weight"].clone();
  sources.train->start_epoch(0);
  trainer.train_step(sources.train->next_batch(), 0.1);
  EXPECT_TRUE(torch::equal(trainer.model()->named_parameters()["conv1.weight"], before));
  EXPECT_EQ(trainer.loss_scaler().scale_value(), static_cast<double>(1e30f) * 0.5);
}

// Deterministic cuDNN (no autotuning) while it lives, so that two runs take the same algorithms.
class DeterministicCudnn {
 public:
  DeterministicCudnn()
      : deterministic_(at::globalContext().deterministicCuDNN()),
        benchmark_(at::globalContext().benchmarkCuDNN()) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~DeterministicCudnn() {
    at::globalContext().setDeterministicCuDNN(deterministic_);
    at::globalContext().setBenchmarkCuDNN(benchmark_);
  }

 private:
  bool deterministic_, benchmark_;
};

// Two trainings of the same steps from `initial` ended alike: every floating-point tensor of
// `got` within a small part of how far `want` moved from `initial` (atomics in some backward
// kernels make even two eager runs differ in the last bits), integers (batches tracked) equal.
// Returns the largest difference.
double expect_trained_alike(const TensorMap& want, const TensorMap& got, const TensorMap& initial) {
  double max_difference = 0;
  for (const auto& [name, tensor] : want) {
    const at::Tensor other = got.at(name).to(tensor.device());  // a checkpoint's are on the CPU
    if (!tensor.is_floating_point()) {
      EXPECT_TRUE(torch::equal(other, tensor)) << name;
      continue;
    }
    const double moved = (tensor - initial.at(name).to(tensor.device())).abs().max().item<double>();
    const double difference = (other - tensor).abs().max().item<double>();
    max_difference = std::max(max_difference, difference);
    EXPECT_LE(difference, 1e-3 * moved + 1e-7) << name << " moved " << moved;
  }
  return max_difference;
}

// The step recorded as a CUDA graph, its update included, computes what the eager step does,
// through warm-up, capture, replays and a short batch between them (run eagerly), with MixUp or
// loss scaling on: the same loss at every step, weights and BN statistics that differ by a small
// part of how far training moved them, and the same loss scale. The learning rate changes every
// step (a replay must read each step's), and in fp16 the scale doubles every 2 clean steps (the
// replays update it, or skip a step that overflows, on the device). Deterministic cuDNN, so both
// trainers run the same algorithms.
void expect_graph_matches_eager(Precision precision, double mixup_alpha) {
  Config c = gpu_config(precision);
  c.mixup_alpha = mixup_alpha;
  c.loss_scale_growth_interval = 2;
  const DeterministicCudnn deterministic;
  const torch::Device device(torch::kCUDA, 0);
  Sources sources = make_sources(c, device);
  TrainerOptions options = trainer_options(c);
  Trainer eager(options, device);
  options.cuda_graph = true;
  Trainer graphed(options, device);
  const TensorMap initial = state_dict(*eager.model());

  std::vector<Batch> batches;  // 5 full, a short one, 3 full
  sources.train->start_epoch(0);
  for (int i = 0; i < 8; ++i) batches.push_back(sources.train->next_batch());
  const Batch& full = batches[4];
  batches.insert(batches.begin() + 5,
                 Batch{full.images.narrow(0, 0, 20), full.labels.narrow(0, 0, 20), at::Tensor()});
  for (size_t step = 0; step < batches.size(); ++step) {
    const double lr = 0.1 / static_cast<double>(step + 1);
    const double expected = eager.train_step(batches[step], lr).item<double>();
    const double loss = graphed.train_step(batches[step], lr).item<double>();
    EXPECT_NEAR(loss, expected, 1e-3 * std::abs(expected) + 1e-5) << "step " << step;
  }
  EXPECT_EQ(graphed.graph_captures(), 1);
  EXPECT_EQ(graphed.graph_replays(), 5);  // full steps 4 to 8: the short one ran eagerly
  EXPECT_EQ(eager.graph_replays(), 0);
  EXPECT_EQ(graphed.loss_scaler().scale_value(), eager.loss_scaler().scale_value());
  EXPECT_EQ(graphed.loss_scaler().skipped_steps_value(), eager.loss_scaler().skipped_steps_value());

  const double difference =
      expect_trained_alike(state_dict(*eager.model()), state_dict(*graphed.model()), initial);
  std::cout << name_of(precision) << ": largest difference, graph against eager: " << difference
            << "\n";
}

TEST_F(Gpu, CudaGraphStepMatchesEagerStepFp16) { expect_graph_matches_eager(Precision::kFp16, 0); }

TEST_F(Gpu, CudaGraphStepMatchesEagerStepBf16WithMixup) {
  expect_graph_matches_eager(Precision::kBf16, 0.2);
}

// Trains to `steps` in all on the GPU, evaluating each epoch, resuming from the output_dir's
// checkpoint when it has one, and returns the checkpoint written at the end.
Checkpoint train_on_gpu_to(Config c, int64_t steps) {
  c.max_steps = steps;
  const torch::Device device(torch::kCUDA, 0);
  Sources sources = make_sources(c, device);
  Trainer trainer(trainer_options(c), device);
  MetricsLog metrics("");
  fit(trainer, fit_options(c), *sources.train, sources.val.get(), metrics);
  EXPECT_GT(trainer.graph_replays(), 0) << "to step " << steps;
  return load_checkpoint(
      checkpoint_path(std::filesystem::path(c.output_dir) / "checkpoints", steps));
}

// Resume with the step as a CUDA graph: a run stopped mid-epoch and resumed (whose new process
// warms up and records the step again) ends where the uninterrupted run does, as closely as the
// graph's step follows the eager one, with the same loss scale. Each epoch ends in a short step
// and an evaluation beside the graph.
TEST_F(Gpu, ResumeWithTheCudaGraphContinuesAsTheUninterruptedRun) {
  const DeterministicCudnn deterministic;
  const testing::TempDir dir;
  auto config = [&](const std::string& name) {
    Config c = gpu_config(Precision::kFp16);
    c.generated_train_images = 232;  // 7 steps of 32 and one of 8 an epoch
    c.cuda_graph = true;
    c.resume = "auto";
    c.output_dir = dir.file(name);
    validate_config(c);
    return c;
  };
  const Config straight = config("straight"), resumed = config("resumed");
  const torch::Device device(torch::kCUDA, 0);
  const TensorMap initial = state_dict(*Trainer(trainer_options(straight), device).model());
  const Checkpoint want = train_on_gpu_to(straight, 20);
  train_on_gpu_to(resumed, 10);
  const Checkpoint got = train_on_gpu_to(resumed, 20);
  EXPECT_EQ(got.progress.step, 20);
  EXPECT_EQ(got.loss_scale, want.loss_scale);
  const double difference = expect_trained_alike(want.model, got.model, initial);
  std::cout << "largest difference, resumed against uninterrupted: " << difference << "\n";
}

// An eager step beside the graph (a short last step): with room (a small network on a large
// card) the graph stays; without (an endless margin: no step fits) it is released, the step runs
// eagerly, and the next full step records it again at once, without another warm-up. Either way
// every step's loss and updated weights are the eager step's.
void expect_graph_makes_room(double memory_margin, int64_t expected_captures) {
  const torch::Device device(torch::kCUDA, 0);
  auto make_net = [&] {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 10));
    net->to(device);
    return net;
  };
  torch::nn::Sequential eager = make_net(), graphed = make_net();
  // A step as the trainer's: forward, backward, the weights updated in place, the gradients
  // dropped after it.
  auto step_of = [](torch::nn::Sequential net) {
    return [net](const at::Tensor& inputs, const at::Tensor& targets) mutable {
      at::Tensor loss = torch::cross_entropy_loss(net->forward(inputs), targets);
      loss.backward();
      const torch::NoGradGuard no_grad;
      for (const at::Tensor& p : net->parameters()) p.sub_(p.grad(), /*alpha=*/0.1);
      return loss.detach();
    };
  };
  auto zero_grad = [](torch::nn::Sequential net) {
    for (const at::Tensor& p : net->parameters()) p.mutable_grad().reset();
  };
  StepGraph graph(device, StepGraphOptions{/*warmup_steps=*/2, memory_margin});
  const std::vector<int64_t> batches = {32, 32, 32, 32, 20, 32, 32};
  for (size_t step = 0; step < batches.size(); ++step) {
    const at::Tensor inputs = torch::randn({batches[step], 64}, device);
    const at::Tensor targets =
        torch::randint(0, 10, {batches[step]}, inputs.options().dtype(at::kLong));
    const at::Tensor want = step_of(eager)(inputs, targets);
    zero_grad(eager);
    const at::Tensor loss = graph.run(inputs, targets, 1.0, step_of(graphed));
    zero_grad(graphed);
    EXPECT_TRUE(torch::allclose(loss, want, 1e-4, 1e-6)) << "step " << step;
    const std::vector<at::Tensor> got = graphed->parameters(), expected = eager->parameters();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-4, 1e-6))
          << "step " << step << ", parameter " << i;
  }
  EXPECT_EQ(graph.captures(), expected_captures);
  EXPECT_EQ(graph.releases(), expected_captures - 1);
  EXPECT_EQ(graph.replays(), 4);  // steps 2, 3, 5 and 6
}

TEST_F(Gpu, CudaGraphStaysBesideAnEagerStepThatFits) { expect_graph_makes_room(1.25, 1); }

TEST_F(Gpu, CudaGraphReleasedForAStepThatDoesNotFitIsRecordedAgainAtOnce) {
  expect_graph_makes_room(std::numeric_limits<double>::infinity(), 2);
}

}  // namespace
}  // namespace trainer
