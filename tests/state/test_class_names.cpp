// Class names from the data to the checkpoint: a checkpoint keeps them (and its weights file
// reads them back), a checkpoint whose classes differ from the data's is refused naming the first
// difference, the records' classes become synsets.txt's lines, and the worst classes are found.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "base/user_error.h"
#include "data/datasets/record_classes.h"
#include "src/report/class_accuracy.h"
#include "src/state/checkpoint.h"
#include "src/state/class_match.h"
#include "src/state/weights.h"
#include "tests/support/temp_dir.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

const std::vector<ClassName> kImagenetStart = {{"n01440764", "tench, Tinca tinca"},
                                               {"n01443537", "goldfish, Carassius auratus"},
                                               {"n01484850", "great white shark"}};

// A folder of this program's, removed when it ends.
fs::path temporary_folder(const std::string& name) {
  static const testing::TempDir root;
  const fs::path dir = root.path() / name;
  fs::create_directories(dir);
  return dir;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

TEST(ClassNames, CheckpointKeepsThemAndLoadingReadsThemBack) {
  const fs::path path = temporary_folder("roundtrip") / "checkpoint-000000001.pt";
  Checkpoint saved;
  saved.classes = kImagenetStart;
  saved.config = "arch = \"resnet18\"\n";
  save_checkpoint(saved, path);
  const Checkpoint loaded = load_checkpoint(path);
  ASSERT_EQ(loaded.classes.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(loaded.classes[i].synset, kImagenetStart[i].synset);
    EXPECT_EQ(loaded.classes[i].text, kImagenetStart[i].text);
  }
  // evaluate_only and init_weights read checkpoints as weights files.
  const WeightsFile weights = read_weights_file(path, "init_weights");
  ASSERT_EQ(weights.classes.size(), 3u);
  EXPECT_EQ(weights.classes[2].text, "great white shark");
}

TEST(ClassNames, ACheckpointWithoutNamesLoadsWithNone) {
  const fs::path path = temporary_folder("none") / "checkpoint-000000001.pt";
  save_checkpoint(Checkpoint{}, path);
  EXPECT_TRUE(load_checkpoint(path).classes.empty());
  EXPECT_TRUE(read_weights_file(path, "resume").classes.empty());
}

TEST(ClassNames, AReorderedDataIsRefusedNamingTheFirstMismatch) {
  const NamedClasses checkpoint{kImagenetStart, "/runs/a/checkpoint-000000010.pt"};
  NamedClasses data{kImagenetStart, "/data/synsets.txt"};
  std::swap(data.names[1], data.names[2]);
  const std::string message =
      message_of([&] { check_same_classes(checkpoint, data, WeightsUse::kEvaluate); });
  EXPECT_NE(message.find("class 1 of the weights in /runs/a/checkpoint-000000010.pt is "
                         "n01443537 (goldfish, Carassius auratus)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("class 1 of the data is n01484850 (great white shark) "
                         "(/data/synsets.txt)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Fix: "), std::string::npos) << message;
}

TEST(ClassNames, EqualNamesOrEitherSideWithoutNamesPass) {
  const NamedClasses named{kImagenetStart, "a"};
  NamedClasses other_words{kImagenetStart, "b"};
  other_words.names[0].text = "";  // TFDS's label.labels.txt has no words: synsets decide
  EXPECT_NO_THROW(check_same_classes(named, other_words, WeightsUse::kResume));
  EXPECT_NO_THROW(check_same_classes(named, NamedClasses{}, WeightsUse::kResume));
  EXPECT_NO_THROW(check_same_classes(NamedClasses{}, named, WeightsUse::kInitialise));
}

TEST(ClassNames, RecordsGiveTheClassesByLowestLabelFirst) {
  RecordClasses classes;
  classes.add(3, "n01484850", "great white shark", "a at byte 0");
  classes.add(1, "n01440764", "", "a at byte 100");
  classes.add(1, "n01440764", "tench, Tinca tinca", "b at byte 0");  // words from a later record
  classes.add(2, "n01443537", "goldfish, Carassius auratus", "b at byte 100");
  classes.add(2, "", "", "b at byte 200");  // no synset: not counted
  std::string gap;
  const std::vector<ClassName> ordered = classes.ordered(&gap);
  EXPECT_EQ(gap, "");
  EXPECT_EQ(classes.lowest_label(), 1);
  ASSERT_EQ(ordered.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ordered[i].synset, kImagenetStart[i].synset);
  EXPECT_EQ(ordered[0].text, "tench, Tinca tinca");

  RecordClasses gapped;
  gapped.add(1, "n01440764", "", "a");
  gapped.add(3, "n01484850", "", "a");
  gapped.ordered(&gap);
  EXPECT_EQ(gap, "2");
}

TEST(ClassNames, OneLabelNamingTwoSynsetsNamesBothRecords) {
  RecordClasses classes;
  classes.add(5, "n01440764", "", "train-0 at byte 0");
  RecordClasses other;
  other.add(5, "n01443537", "", "train-1 at byte 640");
  const std::string message = message_of([&] { classes.merge(other); });
  EXPECT_NE(message.find("label 5 names two classes: n01440764 in train-0 at byte 0 and "
                         "n01443537 in train-1 at byte 640"),
            std::string::npos)
      << message;
}

TEST(ClassNames, WorstClassesComeLowestTop1First) {
  // Per class: 0: 4/4, 1: 1/4, 2: no images, 3: 1/2, 4: 0/3, 5: 1/4 (ties with 1: index order).
  const auto worst = worst_classes({4, 4, 0, 2, 3, 4}, {4, 1, 0, 1, 0, 1}, 3);
  ASSERT_EQ(worst.size(), 3u);
  EXPECT_EQ(worst[0].index, 4);
  EXPECT_EQ(worst[1].index, 1);
  EXPECT_EQ(worst[2].index, 5);
  EXPECT_EQ(describe_classes({worst[1]}, kImagenetStart),
            "1 n01443537 (goldfish, Carassius auratus) 25.00% (1/4)");
  EXPECT_EQ(describe_classes({worst[0]}, {}), "4 0.00% (0/3)");
}

}  // namespace
}  // namespace trainer
