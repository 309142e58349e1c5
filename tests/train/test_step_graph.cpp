// When the training step is recorded as a CUDA graph and replayed (CaptureSchedule, the host's
// logic, the same on any device), when an eager step fits beside the graph, and which shipped
// recipes keep the graph.
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
  const c10::Device gpu(c10::kCUDA, 0);
  const Config dle = recipe_on_a_p3_node("dle-90-epochs.toml");
  ASSERT_EQ(dle.micro_batches(), 1);
  EXPECT_TRUE(keeps_step_graph(trainer_options(dle), gpu));
  EXPECT_FALSE(keeps_step_graph(trainer_options(dle), c10::kCPU));
  Config ffcv = recipe_on_a_p3_node("ffcv-16-epochs.toml");
  ASSERT_EQ(ffcv.micro_batches(), 2);
  EXPECT_FALSE(keeps_step_graph(trainer_options(ffcv), gpu));
  ffcv.benchmark = true;
  EXPECT_TRUE(keeps_step_graph(trainer_options(ffcv), gpu));
  ffcv.cuda_graph = false;
  EXPECT_FALSE(keeps_step_graph(trainer_options(ffcv), gpu));
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
