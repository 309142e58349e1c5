// Data parallelism on the CPU under `mpirun -np 2` and `-np 3` (ctest runs both): gradient
// averaging (a short last step's uneven shares included), identical replicas, equivalence with
// one rank, equal steps on uneven shards and distributed evaluation. Every rank runs every test
// and prints its own results.
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "base/mpi_check.h"
#include "data/sources/memory_source.h"
#include "data/sources/step_shares.h"
#include "src/dist/gradient_reducer.h"
#include "src/dist/process_group.h"
#include "src/dist/watchdog.h"
#include "src/environment.h"
#include "src/fit.h"
#include "src/part_options.h"
#include "src/sources.h"
#include "src/train/trainer.h"

namespace trainer {
namespace {

ProcessGroup* g_group = nullptr;

Config dist_config() {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 100;  // uneven: not a multiple of ranks x batch
  c.generated_val_images = 41;
  c.image_size = 32;
  c.batch_size = 8;
  c.epochs = 2;
  c.warmup_epochs = 0;
  c.base_lr = 0.1;
  c.log_every_steps = 2;
  c.bucket_mb = 1;  // several buckets even for ResNet-18
  c.world_size = g_group->size();
  validate_config(c);
  return c;
}

// A batch that differs per `index` (e.g. per rank).
Batch batch_for(int index) {
  torch::manual_seed(100 + index);
  return {torch::randint(0, 256, {4, 32, 32, 3}, torch::kByte), torch::randint(0, 4, {4})};
}

// Runs forward and backward of `model` on `batch`, on the model's device.
void backward_on(ResNet& model, const Batch& batch) {
  const torch::Device device = model->parameters().front().device();
  auto images = batch.images.permute({0, 3, 1, 2}).to(torch::kFloat).div(255).contiguous();
  torch::cross_entropy_loss(model->forward(images.to(device)), batch.labels.to(device)).backward();
}

std::vector<torch::Tensor> grads_of(ResNet& model, const Batch& batch) {
  for (auto& p : model->parameters()) p.mutable_grad().reset();
  backward_on(model, batch);
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

struct RankGradients {
  std::vector<torch::Tensor> mean;       // per parameter, over ranks
  std::vector<torch::Tensor> magnitude;  // mean of |gradient| over ranks: the rounding scale
};

// Every rank's gradient for `batch_for(step * 10 + rank)`, computed here on one rank.
RankGradients rank_gradients(ResNet& model, int step) {
  RankGradients out;
  for (int r = 0; r < g_group->size(); ++r) {
    auto grads = grads_of(model, batch_for(step * 10 + r));
    for (size_t i = 0; i < grads.size(); ++i) {
      if (r == 0) {
        out.mean.push_back(grads[i].clone());
        out.magnitude.push_back(grads[i].abs());
      } else {
        out.mean[i] += grads[i];
        out.magnitude[i] += grads[i].abs();
      }
    }
  }
  for (auto& g : out.mean) g /= g_group->size();
  for (auto& g : out.magnitude) g /= g_group->size();
  return out;
}

TEST(Distributed, AllReducedGradientIsTheMeanOfPerRankGradients) {
  for (bool predivide : {true, false}) {
    torch::manual_seed(0);
    ResNet model(ResNetOptions{18, 4, false});
    GradientReducer reducer(model->parameters(), *g_group, {1 << 20, predivide, torch::kFloat});
    ASSERT_GT(reducer.bucket_count(), 1);
    const std::vector<std::vector<torch::Tensor>> means = {rank_gradients(model, 0).mean,
                                                           rank_gradients(model, 1).mean};
    // Two steps in a row, the second with the first's averaged gradients still in .grad, as
    // an optimizer leaves them: they must not leak into the second average.
    for (int step = 0; step < 2; ++step) {
      const auto& mean = means[step];
      reducer.prepare_step();
      backward_on(model, batch_for(step * 10 + g_group->rank()));
      reducer.finish_step();
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::allclose(params[i].grad(), mean[i], 1e-4, 1e-6))
            << "parameter " << i << " step " << step << " predivide " << predivide;
    }
  }
}

// The schedule that overlaps communication with backward: buckets in backward order, none over the
// cap, and the input-most one (whose all-reduce nothing can hide) small.
TEST(Distributed, BucketsFollowBackwardOrderWithASmallLastBucket) {
  auto params = ResNet(ResNetOptions{50, 1000, false})->parameters();
  for (auto wire : {torch::kFloat, torch::kHalf}) {
    const ReducerOptions options{25 << 20, true, wire, 1 << 20};
    const auto buckets = GradientReducer::bucket_members(params, options);
    auto bytes_of = [&](const std::vector<int64_t>& members) {
      int64_t bytes = 0;
      for (int64_t i : members) bytes += params[i].numel() * torch::elementSize(wire);
      return bytes;
    };
    std::vector<int64_t> order;
    for (const auto& members : buckets) {
      EXPECT_LE(bytes_of(members), options.bucket_bytes);
      order.insert(order.end(), members.begin(), members.end());
    }
    for (size_t k = 0; k < order.size(); ++k)  // every parameter once, last registered first
      ASSERT_EQ(order[k], static_cast<int64_t>(params.size() - 1 - k));
    EXPECT_LE(bytes_of(buckets.back()), options.last_bucket_bytes);
    EXPECT_GT(buckets.back().size(), 3u);  // conv1, its BN and more: not a sliver
    EXPECT_GE(buckets.size(), wire == torch::kFloat ? 5u : 3u);
  }
}

// This rank's GPU, with the group's NCCL communicator made on it; none when any rank of the node
// has no GPU of its own (every rank then skips alike, so no collective is left waiting).
std::optional<torch::Device> rank_gpu_with_nccl() {
  const bool has_gpu = torch::cuda::is_available() &&
                       torch::cuda::device_count() >= static_cast<int64_t>(g_group->local_size());
  if (g_group->sum(has_gpu ? 0 : 1) > 0) return std::nullopt;
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(g_group->local_rank()));
  const c10::cuda::CUDAGuard device_guard(device);
  if (!g_group->uses_nccl()) g_group->init_nccl(device);
  return device;
}

// The NCCL path: hooks on the autograd engine's device thread, the communication stream and its
// events, gradients as bucket views, and fp16/bf16 on the wire. Needs a GPU for every rank of the
// node (skips otherwise, on every rank alike so no collective is left waiting).
TEST(Distributed, GpuAllReduceIsTheMeanOfPerRankGradients) {
  const std::optional<torch::Device> gpu = rank_gpu_with_nccl();
  if (!gpu) GTEST_SKIP() << "needs one CUDA device per rank";
  const torch::Device device = *gpu;
  c10::cuda::CUDAGuard device_guard(device);
  // Deterministic kernels: each rank's gradient here equals the one computed for it below.
  at::globalContext().setDeterministicCuDNN(true);
  const int ranks = g_group->size();
  for (auto wire : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    torch::manual_seed(0);
    ResNet model(ResNetOptions{18, 4, false});
    model->to(device);
    const RankGradients expected = rank_gradients(model, 0);
    // Rounding to the wire dtype, once per rank and once per addition of the ring, scales
    // with the ranks' own values, not with their mean (which may cancel).
    const double epsilon = wire == torch::kFloat  ? 0x1p-23
                           : wire == torch::kHalf ? 0x1p-11
                                                  : 0x1p-8;
    GradientReducer reducer(model->parameters(), *g_group, {1 << 20, true, wire, 1 << 20});
    for (int step = 0; step < 2; ++step) {  // the same batch twice: the views are reset between
      reducer.prepare_step();
      backward_on(model, batch_for(g_group->rank()));  // step 0's batch: rank_gradients(model, 0)
      reducer.finish_step();
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        auto bound = expected.magnitude[i] * (2.0 * (ranks + 1) * epsilon) + 1e-6;
        EXPECT_TRUE(((params[i].grad() - expected.mean[i]).abs() <= bound).all().item<bool>())
            << "parameter " << i << " step " << step << " wire " << wire;
      }
    }
  }
  at::globalContext().setDeterministicCuDNN(false);
}

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

// Collectives move tensors in any dense layout: channels_last weights (the GPU default) are
// broadcast and summed as they lie.
TEST(Distributed, CollectivesTakeChannelsLastTensors) {
  auto weight = torch::arange(2 * 3 * 4 * 5, torch::kFloat)
                    .reshape({2, 3, 4, 5})
                    .contiguous(torch::MemoryFormat::ChannelsLast);
  ASSERT_FALSE(weight.is_contiguous());
  auto expected = weight.clone();
  if (g_group->rank() != 0) weight.fill_(-1);
  g_group->broadcast_(weight, /*root=*/0);
  EXPECT_TRUE(torch::equal(weight, expected));
  g_group->allreduce_sum_(weight);
  EXPECT_TRUE(torch::equal(weight, expected * g_group->size()));
}

// A failed MPI call comes back as an error naming the call, its file and line and MPI's own
// message (the process group sets MPI_ERRORS_RETURN), for `main` to log with the rank, instead of
// MPI's default abort, which names none of them.
TEST(Distributed, AFailedMpiCallThrowsNamingTheCallAndMpisMessage) {
  if (g_group->launcher() != Launcher::kMpirun) GTEST_SKIP() << "no MPI under torchrun";
  int value = 0;
  const int no_such_rank = g_group->size();
  try {
    MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT, no_such_rank, MPI_COMM_WORLD));
    FAIL() << "a broadcast from a rank that does not exist should fail";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("test_distributed.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("MPI_Bcast"), std::string::npos) << message;
    EXPECT_NE(message.find("root"), std::string::npos) << message;  // MPI_ERR_ROOT's text
  }
}

// Run by tests/test_distributed_cli.py, which checks that the job ends (the watchdog aborts
// every rank) with a message naming the collective: rank 0 enters a count's sum that the other
// ranks never join. Disabled here because it ends the process.
TEST(Distributed, DISABLED_HostCollectiveOneRankMissesEndsTheJob) {
  Watchdog watchdog(*g_group, std::chrono::seconds(2), torch::kCPU);
  if (g_group->rank() == 0)
    g_group->sum(1);
  else
    std::this_thread::sleep_for(std::chrono::seconds(120));
  FAIL() << "the watchdog should have ended the job";
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
    distributed.train_step(mine, 1.0, double(mine.labels.size(0) * world) / step_images);
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
  accumulated.begin_step(/*lr=*/1.0);
  accumulated.accumulate(half(0), /*loss_weight=*/0.5, /*last=*/false);
  accumulated.accumulate(half(4), /*loss_weight=*/0.5, /*last=*/true);
  accumulated.end_step();
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
  FitResult result = fit(trainer, c, *sources.train, nullptr, metrics);
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

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  trainer::Environment env = trainer::read_environment();
  if (env.launcher == trainer::Launcher::kAlone) {
    std::printf(
        "test_distributed runs under mpirun or torchrun (ctest does both); nothing to do "
        "alone\n");
    return 0;
  }
  int result = 0;
  {
    trainer::ProcessGroup group(env, std::chrono::seconds(60));
    trainer::g_group = &group;
    result = RUN_ALL_TESTS();
  }
  return result;
}
