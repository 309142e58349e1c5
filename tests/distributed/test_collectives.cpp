// Data parallelism's collectives on the CPU under `mpirun -np 1, 2, 3` and torchrun (ctest runs
// each): gradient averaging and its buckets, on the GPU too where every rank has one, tensors in
// channels_last, MPI's errors. The training tests of the same binary are in
// test_data_parallel_training.cpp; main is here. Every rank runs every test and prints its own
// results.
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>
#include <thread>

#include "base/mpi_check.h"
#include "models/resnet.h"
#include "src/distributed/gradient_reducer.h"
#include "src/distributed/process_group.h"
#include "src/distributed/watchdog.h"
#include "src/environment.h"
#include "tests/support/distributed_support.h"

namespace trainer {
namespace {

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
    EXPECT_NE(message.find("test_collectives.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("MPI_Bcast"), std::string::npos) << message;
    EXPECT_NE(message.find("root"), std::string::npos) << message;  // MPI_ERR_ROOT's text
  }
}

// Run by tests/distributed/test_distributed_cli.py, which checks that the job ends (the watchdog
// aborts every rank) with a message naming the collective: rank 0 enters a count's sum that the
// other ranks never join. Disabled here because it ends the process.
TEST(Distributed, DISABLED_HostCollectiveOneRankMissesEndsTheJob) {
  Watchdog watchdog(*g_group, std::chrono::seconds(2), torch::kCPU);
  if (g_group->rank() == 0)
    g_group->sum(1);
  else
    std::this_thread::sleep_for(std::chrono::seconds(120));
  FAIL() << "the watchdog should have ended the job";
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  trainer::Environment env = trainer::read_environment();
  if (env.launcher == trainer::Launcher::kAlone) {
    std::printf(
        "distributed_tests runs under mpirun or torchrun (ctest does both); nothing to do "
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
