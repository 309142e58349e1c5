// Checkpoints and weights files: a checkpoint round-trips every field, rotation keeps the newest,
// unfinished writes are removed, and corrupt, mismatched, crafted or oversized files are user
// errors that name the file.
#include <caffe2/serialize/inline_container.h>
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

}  // namespace
}  // namespace trainer
