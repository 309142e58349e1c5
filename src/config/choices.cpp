// The names of the choice keys' values (src/config/config.h): what the config file and the command
// line take, what --help lists and config.toml writes.
#include "src/config/config.h"

namespace trainer {

const std::vector<ChoiceName<Arch>>& choice_names(Arch) {
  static const std::vector<ChoiceName<Arch>> names = {{Arch::kResNet18, "resnet18"},
                                                      {Arch::kResNet34, "resnet34"},
                                                      {Arch::kResNet50, "resnet50"},
                                                      {Arch::kResNet101, "resnet101"},
                                                      {Arch::kResNet152, "resnet152"}};
  return names;
}
const std::vector<ChoiceName<Trainable>>& choice_names(Trainable) {
  static const std::vector<ChoiceName<Trainable>> names = {{Trainable::kAll, "all"},
                                                           {Trainable::kClassifier, "classifier"}};
  return names;
}
const std::vector<ChoiceName<DeviceChoice>>& choice_names(DeviceChoice) {
  static const std::vector<ChoiceName<DeviceChoice>> names = {
      {DeviceChoice::kAuto, "auto"}, {DeviceChoice::kCuda, "cuda"}, {DeviceChoice::kCpu, "cpu"}};
  return names;
}
const std::vector<ChoiceName<Precision>>& choice_names(Precision) {
  static const std::vector<ChoiceName<Precision>> names = {
      {Precision::kFp32, "fp32"}, {Precision::kFp16, "fp16"}, {Precision::kBf16, "bf16"}};
  return names;
}
const std::vector<ChoiceName<DataSource>>& choice_names(DataSource) {
  static const std::vector<ChoiceName<DataSource>> names = {{DataSource::kSynthetic, "synthetic"},
                                                            {DataSource::kGenerated, "generated"},
                                                            {DataSource::kTfrecord, "tfrecord"}};
  return names;
}
const std::vector<ChoiceName<BadRecordPolicy>>& choice_names(BadRecordPolicy) {
  static const std::vector<ChoiceName<BadRecordPolicy>> names = {{BadRecordPolicy::kSkip, "skip"},
                                                                 {BadRecordPolicy::kFail, "fail"}};
  return names;
}
const std::vector<ChoiceName<RecordLayout>>& choice_names(RecordLayout) {
  // The data layer's names, which the tools' --record-layout takes too.
  static const std::vector<ChoiceName<RecordLayout>> names = {
      {RecordLayout::kAuto, layout_name(RecordLayout::kAuto)},
      {RecordLayout::kTensorflow, layout_name(RecordLayout::kTensorflow)},
      {RecordLayout::kTfds, layout_name(RecordLayout::kTfds)}};
  return names;
}
const std::vector<ChoiceName<AutoAugmentPolicy>>& choice_names(AutoAugmentPolicy) {
  static const std::vector<ChoiceName<AutoAugmentPolicy>> names = {
      {AutoAugmentPolicy::kNone, "none"},
      {AutoAugmentPolicy::kTrivialAugmentWide, "trivialaugment_wide"},
      {AutoAugmentPolicy::kRandAugment, "randaugment"},
      {AutoAugmentPolicy::kAutoAugmentImageNet, "autoaugment_imagenet"}};
  return names;
}
const std::vector<ChoiceName<Interpolation>>& choice_names(Interpolation) {
  static const std::vector<ChoiceName<Interpolation>> names = {
      {Interpolation::kNearest, "nearest"}, {Interpolation::kBilinear, "bilinear"}};
  return names;
}
const std::vector<ChoiceName<TrainCrop>>& choice_names(TrainCrop) {
  static const std::vector<ChoiceName<TrainCrop>> names = {
      {TrainCrop::kRandomResized, "random_resized"},
      {TrainCrop::kDistortedBoundingBox, "distorted_bounding_box"}};
  return names;
}
const std::vector<ChoiceName<EpochOrder>>& choice_names(EpochOrder) {
  static const std::vector<ChoiceName<EpochOrder>> names = {{EpochOrder::kGlobal, "global"},
                                                            {EpochOrder::kByNode, "by_node"}};
  return names;
}
const std::vector<ChoiceName<WeightInit>>& choice_names(WeightInit) {
  static const std::vector<ChoiceName<WeightInit>> names = {
      {WeightInit::kTorchvision, "torchvision"}, {WeightInit::kHeNormalFanIn, "he_normal_fan_in"}};
  return names;
}
const std::vector<ChoiceName<LossKind>>& choice_names(LossKind) {
  static const std::vector<ChoiceName<LossKind>> names = {
      {LossKind::kCrossEntropy, "cross_entropy"}, {LossKind::kBce, "bce"}};
  return names;
}
const std::vector<ChoiceName<OptimizerKind>>& choice_names(OptimizerKind) {
  static const std::vector<ChoiceName<OptimizerKind>> names = {{OptimizerKind::kSgd, "sgd"},
                                                               {OptimizerKind::kLars, "lars"}};
  return names;
}
const std::vector<ChoiceName<LrScheduleKind>>& choice_names(LrScheduleKind) {
  static const std::vector<ChoiceName<LrScheduleKind>> names = {{LrScheduleKind::kCosine, "cosine"},
                                                                {LrScheduleKind::kStep, "step"},
                                                                {LrScheduleKind::kPoly, "poly"}};
  return names;
}
const std::vector<ChoiceName<EmaBuffers>>& choice_names(EmaBuffers) {
  static const std::vector<ChoiceName<EmaBuffers>> names = {{EmaBuffers::kCopy, "copy"},
                                                            {EmaBuffers::kAverage, "average"}};
  return names;
}
const std::vector<ChoiceName<GradAverage>>& choice_names(GradAverage) {
  static const std::vector<ChoiceName<GradAverage>> names = {{GradAverage::kPre, "pre"},
                                                             {GradAverage::kPost, "post"}};
  return names;
}
const std::vector<ChoiceName<GradCompression>>& choice_names(GradCompression) {
  static const std::vector<ChoiceName<GradCompression>> names = {{GradCompression::kNone, "none"},
                                                                 {GradCompression::kFp16, "fp16"},
                                                                 {GradCompression::kBf16, "bf16"}};
  return names;
}

}  // namespace trainer
