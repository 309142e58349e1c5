// Test helper for tests/train/test_technique_parity.py: runs this project's training techniques on
// tensors that Python wrote (torch.save of a dict of tensors), and writes what they give back, so
// that the test can put them beside torchvision's, timm's and FFCV's:
//   technique_parity_tool mix  IN OUT: {"images", "targets", "params": [kind, lam, x1, y1, x2, y2]}
//                                      -> {"images", "targets"}   (kind: 1 MixUp, 2 CutMix)
//   technique_parity_tool loss IN OUT: {"logits", "targets", "params": [bce, smoothing]}
//                                      -> {"loss"}   (targets: class indices or probabilities)
//   technique_parity_tool blurpool ARCH OUT: a BlurPool model's {"model": state_dict, "input",
//                                      "logits"} (eval mode, fp32, CPU)
//   technique_parity_tool ema  IN OUT: a ResNet-18's state dicts after each step,
//                                      {"<step>.<name>", "params": [steps, classes, decay, every,
//                                      average_buffers, warmup_reset, images_per_step,
//                                      samples_per_epoch, warmup_epochs]} -> the EMA's state dict
//   technique_parity_tool ra   IN OUT: {"params": [records, world, batch, repetitions, seed,
//                                      epoch]} -> {"keys": (world, records / world) each rank's
//                                      keys of the epoch (record x repetitions + copy)}
#include <torch/torch.h>

#include <iostream>

#include "data/sources/epoch_plan.h"
#include "models/resnet.h"
#include "src/state/checkpoint.h"
#include "src/train/batch_mixing.h"
#include "src/train/loss.h"
#include "src/train/lr_schedule.h"
#include "src/train/weight_average.h"
#include "tests/support/tensor_files.h"

using namespace trainer;

namespace {

at::Tensor tensor(const c10::impl::GenericDict& dict, const char* key) {
  return dict.at(key).toTensor();
}

void mix(const std::string& in_path, const std::string& out_path) {
  const auto in = read_dict(in_path);
  const at::Tensor p = tensor(in, "params").to(at::kDouble);
  MixDraw draw;
  draw.kind = p[0].item<int>() == 1 ? MixKind::kMixUp : MixKind::kCutMix;
  draw.lam = p[1].item<double>();
  draw.x1 = p[2].item<int64_t>(), draw.y1 = p[3].item<int64_t>();
  draw.x2 = p[4].item<int64_t>(), draw.y2 = p[5].item<int64_t>();
  const auto [images, targets] = apply_mix(draw, tensor(in, "images"), tensor(in, "targets"));
  c10::Dict<std::string, at::Tensor> out;
  out.insert("images", images);
  out.insert("targets", targets);
  write_tensors(out_path, out);
}

void loss(const std::string& in_path, const std::string& out_path) {
  const auto in = read_dict(in_path);
  const at::Tensor p = tensor(in, "params").to(at::kDouble);
  const LossOptions options{p[0].item<int>() == 1 ? LossKind::kBce : LossKind::kCrossEntropy,
                            p[1].item<double>()};
  c10::Dict<std::string, at::Tensor> out;
  out.insert("loss", training_loss(tensor(in, "logits"), tensor(in, "targets"), options));
  write_tensors(out_path, out);
}

void blurpool(const std::string& arch, const std::string& out_path) {
  torch::manual_seed(0);
  ResNet model(ResNetOptions{resnet_depth_from_name(arch), 10, false, /*blurpool=*/true});
  for (int i = 0; i < 3; ++i) model->forward(torch::randn({4, 3, 64, 64}) * 2 + 0.5);  // BN stats
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor input = torch::randn({2, 3, 64, 64});
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, t] : state_dict(*model)) out.insert("model." + name, t);
  out.insert("input", input);
  out.insert("logits", model->forward(input));
  write_tensors(out_path, out);
}

// The trainer's EMA over a given sequence of weights: after step s (1-based) the model holds
// "<s>.*", then the EMA updates as Trainer::step does, copying where fit would.
void ema(const std::string& in_path, const std::string& out_path) {
  const auto in = read_dict(in_path);
  const at::Tensor p = tensor(in, "params").to(at::kDouble);
  const auto value = [&](int i) { return p[i].item<double>(); };
  const auto steps = static_cast<int64_t>(value(0)), every = static_cast<int64_t>(value(3));
  const auto images_per_step = static_cast<int64_t>(value(6));
  const bool warmup_reset = value(5) != 0;
  LrScheduleOptions schedule_options;
  schedule_options.images_per_step = images_per_step;
  schedule_options.warmup_epochs = value(8);
  const LrSchedule schedule(schedule_options, static_cast<int64_t>(value(7)));

  const ResNetOptions options{18, static_cast<int64_t>(value(1)), false};
  ResNet model(options);
  auto load_step = [&](int64_t step) {
    TensorMap state;
    for (const auto& [name, t] : state_dict(*model))
      state[name] = tensor(in, (std::to_string(step) + "." + name).c_str());
    load_state_dict(*model, state, "step " + std::to_string(step));
  };
  load_step(0);
  WeightAverage average(model, ResNet(options), value(2), every,
                        value(4) != 0 ? EmaBuffers::kAverage : EmaBuffers::kCopy);
  for (int64_t step = 1; step <= steps; ++step) {
    load_step(step);
    const int64_t trained = (step - 1) * images_per_step;
    average.update(
        step, warmup_reset && warmup_update_copies(schedule, trained, every * images_per_step));
  }
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, t] : average.state()) out.insert(name, t);
  write_tensors(out_path, out);
}

// Each rank's plan of one epoch of one file of records under repeated augmentation.
void ra(const std::string& in_path, const std::string& out_path) {
  const auto in = read_dict(in_path);
  const at::Tensor params = tensor(in, "params").to(at::kLong);
  const int64_t records = params[0].item<int64_t>(), world = params[1].item<int64_t>();
  RecordTable table({records});
  at::Tensor keys = at::empty({world, records / world}, at::kLong);
  for (int rank = 0; rank < world; ++rank) {
    PlanOptions o{true,
                  static_cast<uint64_t>(params[4].item<int64_t>()),
                  params[2].item<int64_t>(),
                  0,
                  64,
                  rank,
                  static_cast<int>(world),
                  EpochOrder::kGlobal,
                  params[3].item<int64_t>()};
    const auto plan = rank_plan(table, o, params[5].item<int64_t>());
    TORCH_CHECK(static_cast<int64_t>(plan.size()) == records / world, "uneven plan");
    keys[rank].copy_(at::tensor(plan, at::kLong));
  }
  c10::Dict<std::string, at::Tensor> out;
  out.insert("keys", keys);
  write_tensors(out_path, out);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 4 ? argv[1] : "";
  if (mode == "mix") {
    mix(argv[2], argv[3]);
  } else if (mode == "loss") {
    loss(argv[2], argv[3]);
  } else if (mode == "ema") {
    ema(argv[2], argv[3]);
  } else if (mode == "blurpool") {
    blurpool(argv[2], argv[3]);
  } else if (mode == "ra") {
    ra(argv[2], argv[3]);
  } else {
    std::cerr << "usage: technique_parity_tool mix|loss|ema|ra IN OUT | blurpool ARCH OUT\n";
    return 2;
  }
  return 0;
}
