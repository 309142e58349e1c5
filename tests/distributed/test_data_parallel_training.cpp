// Training under `mpirun -np 1, 2, 3` and torchrun (ctest runs each; main is
// test_collectives.cpp's): identical replicas, equivalence with one rank, a short last step's
// uneven shares and micro-batch accumulation averaged over the step's images, equal steps on uneven
// shards, distributed evaluation and the CUDA graph's step beside the eager one. Every rank runs
// every test.
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>

#include "data/sources/step_shares.h"
#include "src/distributed/watchdog.h"
#include "src/part_options.h"
#include "src/run/fit.h"
#include "src/sources.h"
#include "src/state/weights.h"
#include "src/train/trainer.h"
#include "tests/support/distributed_support.h"

namespace trainer {
namespace {

// The step as a CUDA graph with the gradient all-reduce recorded in it (NCCL), under a running
// collective watchdog as in `train`: every rank's losses and weights are those of the eager step
// over warm-up, capture and replays, within a small part of how far training moved them.
TEST(Distributed, GpuCudaGraphStepMatchesEagerStep) {
  const std::optional<torch::Device> gpu = rank_gpu_with_nccl();
  if (!gpu) GTEST_SKIP() << "needs one CUDA device per rank";
  const torch::Device device = *gpu;
  c10::cuda::CUDAGuard device_guard(device);
  at::globalContext().setDeterministicCuDNN(true);
  Watchdog watchdog(*g_group, std::chrono::seconds(60), device);
  Config c = dist_config();
  c.precision = Precision::kFp16;
  c.device = DeviceChoice::kCuda;
  validate_config(c);
  TrainerOptions options = trainer_options(c);
  Trainer eager(options, device, g_group);
  options.cuda_graph = true;
  Trainer graphed(options, device, g_group);
  const auto initial = eager.model()->named_parameters();
  std::map<std::string, at::Tensor> start;
  for (const auto& item : initial) start[item.key()] = item.value().detach().clone();
  for (int step = 0; step < 7; ++step) {
    const Batch batch = batch_for(step * g_group->size() + g_group->rank());
    const double expected = eager.train_step(batch, 0.1).item<double>();
    const double loss = graphed.train_step(batch, 0.1).item<double>();
    EXPECT_NEAR(loss, expected, 1e-3 * std::abs(expected) + 1e-5) << "step " << step;
  }
  EXPECT_EQ(graphed.graph_replays(), 4);  // steps 4 to 7
  auto want = eager.model()->named_parameters();
  for (const auto& item : graphed.model()->named_parameters()) {
    const at::Tensor& expected = want[item.key()];
    const double moved = (expected - start[item.key()]).abs().max().item<double>();
    const double difference = (item.value() - expected).abs().max().item<double>();
    EXPECT_LE(difference, 1e-3 * moved + 1e-7) << item.key() << " moved " << moved;
  }
  at::globalContext().setDeterministicCuDNN(false);
}

TEST(Distributed, ReplicasStayBitwiseIdentical) {
  Config c = dist_config();
  c.seed = 7 + g_group->rank();  // different seeds: rank 0's weights must win the broadcast
  Sources sources = make_sources(c, torch::kCPU, g_group->rank());
  Trainer trainer(trainer_options(c), torch::kCPU, g_group);
  sources.train->start_epoch(0);
  for (int step = 0; step < 3; ++step) trainer.train_step(sources.train->next_batch(), 0.1);
  trainer.sync_buffers();
  for (const auto& item : trainer.model()->named_parameters()) {
    auto rank0 = item.value().detach().clone();
    g_group->broadcast_(rank0, 0);
    EXPECT_TRUE(torch::equal(rank0, item.value())) << item.key();
  }
}

TEST(Distributed, SameBatchOnEveryRankReproducesOneRank) {
  Config c = dist_config();
  Trainer distributed(trainer_options(c), torch::kCPU, g_group);
  Trainer alone(trainer_options(c), torch::kCPU);
  for (int step = 0; step < 3; ++step) {
    const Batch batch = batch_for(step);  // the same on every rank
    distributed.train_step(batch, 0.1);
    alone.train_step(batch, 0.1);
  }
  auto expected = alone.model()->named_parameters();
  for (const auto& item : distributed.model()->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), expected[item.key()], 1e-4, 1e-5))  // rounding of /N
        << item.key() << " max difference "
        << (item.value() - expected[item.key()]).abs().max().item<double>();
}

// The epoch's short last step: ranks hold shares of different sizes, one possibly empty, and the
// averaged gradient is still the mean over the step's images (each share weighted by its size),
// as if the whole step had one rank per share. Compared through one SGD step at lr 1.
TEST(Distributed, ShortStepAveragesTheGradientOverItsImages) {
  Config c = dist_config();
  c.image_size = 64;  // a share of one image still has more than one value per BN channel
  c.weight_decay = 0;
  c.label_smoothing = 0;
  const int world = g_group->size();
  for (int64_t step_images : {int64_t{2 * world + 1}, int64_t{world + 1}, int64_t{world - 1}}) {
    if (step_images == 0) continue;  // one rank: no empty share to test
    std::vector<Batch> shares;
    for (int r = 0; r < world; ++r) {
      torch::manual_seed(200 + r);
      const int64_t rows = share_of(step_images, c.batch_size, r, world).count;
      shares.push_back({torch::randint(0, 256, {rows, 64, 64, 3}, torch::kByte),
                        torch::randint(0, 4, {rows}), torch::arange(rows)});
    }
    // Expected: each share's own step on a fresh replica, weighted by its share of the images.
    Trainer reference(trainer_options(c), torch::kCPU);
    const auto before = reference.model()->named_parameters();
    std::map<std::string, torch::Tensor> expected;
    for (int r = 0; r < world; ++r) {
      if (shares[r].labels.size(0) == 0) continue;
      Trainer alone(trainer_options(c), torch::kCPU);
      alone.train_step(shares[r], /*lr=*/1.0);
      const double weight = double(shares[r].labels.size(0)) / step_images;
      for (const auto& item : alone.model()->named_parameters()) {
        auto delta = (item.value() - before[item.key()]) * weight;
        expected[item.key()] = expected.count(item.key()) ? expected[item.key()] + delta : delta;
      }
    }
    Trainer distributed(trainer_options(c), torch::kCPU, g_group);
    const Batch& mine = shares[g_group->rank()];
    distributed.train_step(mine, /*lr=*/1.0, step_images);
    for (const auto& item : distributed.model()->named_parameters())
      EXPECT_TRUE(
          torch::allclose(item.value() - before[item.key()], expected[item.key()], 1e-4, 1e-6))
          << item.key() << " with " << step_images << " images on " << world << " ranks";
  }
}

// global_batch: a step accumulated over two micro-batches of a rank's images is the step on
// the whole batch (Note [Fixed global batch]), gradients averaged over ranks once at the end.
// Batch norm in evaluation mode, so that splitting a batch changes no statistics.
TEST(Distributed, TwoMicroBatchesStepLikeTheirUnion) {
  Config c = dist_config();
  c.weight_decay = 0;
  c.label_smoothing = 0;
  torch::manual_seed(300 + g_group->rank());
  const Batch whole{torch::randint(0, 256, {8, c.image_size, c.image_size, 3}, torch::kByte),
                    torch::randint(0, 4, {8}), torch::arange(8)};
  auto half = [&](int64_t start) {
    return Batch{whole.images.narrow(0, start, 4), whole.labels.narrow(0, start, 4),
                 whole.ids.narrow(0, start, 4)};
  };
  Trainer one(trainer_options(c), torch::kCPU, g_group),
      accumulated(trainer_options(c), torch::kCPU, g_group);
  one.model()->eval();
  accumulated.model()->eval();
  one.train_step(whole, /*lr=*/1.0);
  StepInputs inputs;
  inputs.lr = 1.0;
  inputs.micro_batches = 2;
  inputs.step_images = 8 * g_group->size();
  int64_t start = 0;
  accumulated.step(inputs, [&] {
    const Batch next = half(start);
    start += 4;
    return next;
  });
  EXPECT_EQ(start, 8);
  const auto expected = one.model()->named_parameters();
  for (const auto& item : accumulated.model()->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), expected[item.key()], 1e-4, 1e-6))
        << item.key() << " on " << g_group->size() << " ranks";
}

TEST(Distributed, UnevenShardsRunEqualStepsAndFinish) {
  Config c = dist_config();
  c.resume = "none";
  // One folder for every rank, named by rank 0's process and removed by it when all are done.
  const auto first_pid = static_cast<int64_t>(g_group->allgather(double(::getpid()))[0]);
  c.output_dir = (std::filesystem::temp_directory_path() /
                  ("trainer-test-uneven-" + std::to_string(first_pid)))
                     .string();
  Sources sources = make_sources(c, torch::kCPU, g_group->rank());
  const auto per_rank = g_group->allgather(double(sources.train->batches_left()));
  for (double n : per_rank) EXPECT_EQ(n, per_rank[0]);
  const int global = 8 * g_group->size();
  EXPECT_EQ(per_rank[0], (100 + global - 1) / global);  // the last step short, nothing dropped
  Trainer trainer(trainer_options(c), torch::kCPU, g_group);
  MetricsLog metrics("");
  FitResult result = fit(trainer, fit_options(c), *sources.train, nullptr, metrics);
  for (double steps : g_group->allgather(double(result.steps))) EXPECT_EQ(steps, 2 * per_rank[0]);
  if (g_group->rank() == 0) std::filesystem::remove_all(c.output_dir);  // the allgather: all done
}

TEST(Distributed, EvaluationCountsEveryImageOnceAndMatchesOneRank) {
  Config c = dist_config();
  Sources sharded = make_sources(c, torch::kCPU, g_group->rank());
  Trainer trainer(trainer_options(c), torch::kCPU, g_group);
  sharded.train->start_epoch(0);
  trainer.train_step(sharded.train->next_batch(), 0.1);  // a model that is not at chance
  trainer.sync_buffers();
  EvalResult distributed = trainer.evaluate(*sharded.val);

  Config one = c;
  one.world_size = 1;
  Sources whole = make_sources(one, torch::kCPU, 0);
  Trainer local(trainer_options(one), torch::kCPU);
  load_state_dict(*local.model(), state_dict(*trainer.model()));
  EvalResult expected = local.evaluate(*whole.val);
  EXPECT_EQ(distributed.images, 41);
  EXPECT_EQ(distributed.top1_correct, expected.top1_correct);
  EXPECT_EQ(distributed.top5_correct, expected.top5_correct);
}

}  // namespace
}  // namespace trainer
