#include "data/datasets/imagenet_download.h"

#include <matio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/user_error.h"
#include "data/datasets/image_folder.h"
#include "data/formats/tar/tar.h"
#include "data/formats/tfrecord/file.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTrainTar = "ILSVRC2012_img_train.tar";
constexpr const char* kValTar = "ILSVRC2012_img_val.tar";
constexpr const char* kDevkit = "ILSVRC2012_devkit_t12.tar.gz";
constexpr const char* kSynsetMapping = "LOC_synset_mapping.txt";
constexpr const char* kKaggleData = "ILSVRC/Data/CLS-LOC";

// Runs body(i) for i in [0, n) on `threads` threads; the first exception is rethrown.
template <typename Body>
void parallel_for(size_t n, int threads, Body body) {
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (size_t i = next++; i < n; i = next++) body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }
std::string stem(const std::string& path) { return fs::path(path).stem().string(); }

// The label of each class's WNID (1-based, in the order of `classes`).
std::map<std::string, int64_t> labels_by_synset(const std::vector<ClassName>& classes) {
  std::map<std::string, int64_t> labels;
  for (size_t i = 0; i < classes.size(); ++i) labels[classes[i].synset] = int64_t(i) + 1;
  return labels;
}

SourceImage labelled(SourceImage image, const std::string& synset,
                     const std::map<std::string, int64_t>& labels,
                     const std::vector<ClassName>& classes, const std::string& where) {
  const auto it = labels.find(synset);
  USER_CHECK(it != labels.end(), where, ": '", synset, "' is not one of the ", classes.size(),
             " classes: a download of another ImageNet release, or damaged? Fix: use the ",
             "ILSVRC2012 files");
  image.synset = synset;
  image.label = it->second;
  image.text = classes[it->second - 1].text;
  return image;
}

// ---- image-net.org: the devkit's meta.mat, read with libmatio -------------------------------

std::string mat_text(matvar_t* field) {
  if (field == nullptr || field->class_type != MAT_C_CHAR || field->data == nullptr) return "";
  size_t n = 1;
  for (int d = 0; d < field->rank; ++d) n *= field->dims[d];
  std::string out;
  for (size_t i = 0; i < n; ++i) {  // MATLAB stores text as UTF-16 (or UTF-8) code units
    const uint32_t c = field->data_size == 2 ? static_cast<const uint16_t*>(field->data)[i]
                                             : static_cast<const uint8_t*>(field->data)[i];
    out += c < 0x80 ? static_cast<char>(c) : '?';  // WNIDs and ImageNet's words are ASCII
  }
  return out;
}

double mat_number(matvar_t* field, const std::string& what) {
  USER_CHECK(field != nullptr && field->data != nullptr && field->rank >= 1 && field->dims[0] > 0,
             what, " is missing or empty");
  switch (field->class_type) {
    case MAT_C_DOUBLE:
      return *static_cast<const double*>(field->data);
    case MAT_C_SINGLE:
      return *static_cast<const float*>(field->data);
    case MAT_C_INT64:
      return double(*static_cast<const int64_t*>(field->data));
    case MAT_C_UINT64:
      return double(*static_cast<const uint64_t*>(field->data));
    case MAT_C_INT32:
      return *static_cast<const int32_t*>(field->data);
    case MAT_C_UINT32:
      return *static_cast<const uint32_t*>(field->data);
    case MAT_C_INT16:
      return *static_cast<const int16_t*>(field->data);
    case MAT_C_UINT16:
      return *static_cast<const uint16_t*>(field->data);
    case MAT_C_INT8:
      return *static_cast<const int8_t*>(field->data);
    case MAT_C_UINT8:
      return *static_cast<const uint8_t*>(field->data);
    default:
      throw UserError(detail::concat(what, " is not a number"));
  }
}

struct DevkitClass {
  int64_t id = 0;  // ILSVRC2012_ID
  ClassName name;
};

// The synsets without children (the 1,000 classes) of meta.mat's `synsets` struct array.
std::vector<DevkitClass> read_meta_mat(const std::string& path, const std::string& what) {
  mat_t* mat = Mat_Open(path.c_str(), MAT_ACC_RDONLY);
  USER_CHECK(mat != nullptr, what, " is not a MATLAB file");
  matvar_t* synsets = Mat_VarRead(mat, "synsets");
  Mat_Close(mat);
  USER_CHECK(synsets != nullptr && synsets->class_type == MAT_C_STRUCT, what,
             " holds no struct array 'synsets'");
  size_t n = 1;
  for (int d = 0; d < synsets->rank; ++d) n *= synsets->dims[d];
  std::vector<DevkitClass> classes;
  try {
    for (size_t i = 0; i < n; ++i) {
      const std::string entry = detail::concat(what, " synsets(", i + 1, ")");
      auto field = [&](const char* name) { return Mat_VarGetStructFieldByName(synsets, name, i); };
      if (mat_number(field("num_children"), entry + ".num_children") != 0) continue;
      const auto id = static_cast<int64_t>(mat_number(field("ILSVRC2012_ID"), entry + ".ID"));
      classes.push_back({id, {mat_text(field("WNID")), mat_text(field("words"))}});
      USER_CHECK(!classes.back().name.synset.empty(), entry, ".WNID is empty");
    }
  } catch (...) {
    Mat_VarFree(synsets);
    throw;
  }
  Mat_VarFree(synsets);
  USER_CHECK(!classes.empty(), what, " names no class (no synset without children)");
  return classes;
}

// libmatio reads files only: the devkit's meta.mat goes through a temporary file.
std::vector<DevkitClass> read_meta_mat_bytes(const std::string& bytes, const std::string& what) {
  std::string path = (fs::temp_directory_path() / "make-tfrecords-meta-XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  USER_CHECK(fd >= 0, "cannot create a temporary file in ", fs::temp_directory_path().string());
  const bool written = ::write(fd, bytes.data(), bytes.size()) == ssize_t(bytes.size());
  ::close(fd);
  try {
    USER_CHECK(written, "cannot write ", path);
    auto classes = read_meta_mat(path, what);
    fs::remove(path);
    return classes;
  } catch (...) {
    fs::remove(path);
    throw;
  }
}

struct Devkit {
  std::vector<ClassName> classes;               // sorted by WNID: label order
  std::map<int64_t, std::string> synset_by_id;  // ILSVRC2012_ID -> WNID
  std::vector<int64_t> validation_ids;          // per validation image, in file-name order
};

Devkit read_devkit(const std::string& path) {
  const std::string bytes = read_gzip_file(path);
  std::string meta, truth;
  for (const auto& m : list_tar(bytes, path)) {
    if (ends_with(m.name, "data/meta.mat")) meta = bytes.substr(m.offset, m.size);
    if (ends_with(m.name, "data/ILSVRC2012_validation_ground_truth.txt"))
      truth = bytes.substr(m.offset, m.size);
  }
  USER_CHECK(!meta.empty(), path,
             " holds no data/meta.mat: not ImageNet 2012's devkit? Fix: ", "download ", kDevkit,
             " again");
  Devkit devkit;
  for (auto& c : read_meta_mat_bytes(meta, path + ":data/meta.mat")) {
    devkit.synset_by_id[c.id] = c.name.synset;
    devkit.classes.push_back(std::move(c.name));
  }
  std::sort(devkit.classes.begin(), devkit.classes.end(),
            [](const ClassName& a, const ClassName& b) { return a.synset < b.synset; });
  std::istringstream lines(truth);
  for (int64_t id; lines >> id;) devkit.validation_ids.push_back(id);
  return devkit;
}

ImageNetSplit list_train_tar(const std::string& path, const std::vector<ClassName>& classes,
                             int threads) {
  auto archive = std::make_shared<const ReadFile>(path);
  const ReadAt read = [&archive](int64_t offset, char* out, int64_t size) {
    return archive->read_at(offset, out, size);
  };
  const auto inner = list_tar(read, 0, archive->size(), path);
  const auto labels = labels_by_synset(classes);
  std::vector<std::vector<SourceImage>> per_class(inner.size());
  parallel_for(inner.size(), threads, [&](size_t c) {
    const std::string where = path + ":" + inner[c].name;
    for (const auto& m : list_tar(read, inner[c].offset, inner[c].offset + inner[c].size, where)) {
      SourceImage image{path, archive, m.offset, m.size, base_name(m.name)};
      per_class[c].push_back(
          labelled(std::move(image), stem(inner[c].name), labels, classes, where));
    }
  });
  ImageNetSplit split{"train", {}, kImageNetTrainImages};
  for (auto& images : per_class)
    for (auto& image : images) split.images.push_back(std::move(image));
  return split;
}

ImageNetSplit list_val_tar(const std::string& path, const Devkit& devkit) {
  auto archive = std::make_shared<const ReadFile>(path);
  const ReadAt read = [&archive](int64_t offset, char* out, int64_t size) {
    return archive->read_at(offset, out, size);
  };
  auto members = list_tar(read, 0, archive->size(), path);
  std::sort(
      members.begin(), members.end(),  // the ground truth's order (torchvision's too)
      [](const TarMember& a, const TarMember& b) { return base_name(a.name) < base_name(b.name); });
  USER_CHECK(members.size() == devkit.validation_ids.size(), path, " holds ", members.size(),
             " images but the devkit's ground truth names ", devkit.validation_ids.size(),
             ": the two come from different downloads, or one is incomplete");
  const auto labels = labels_by_synset(devkit.classes);
  ImageNetSplit split{"validation", {}, kImageNetValidationImages};
  for (size_t i = 0; i < members.size(); ++i) {
    const auto id = devkit.synset_by_id.find(devkit.validation_ids[i]);
    USER_CHECK(id != devkit.synset_by_id.end(), "the devkit's ground truth gives ", members[i].name,
               " the class ID ", devkit.validation_ids[i], ", which meta.mat does not name");
    SourceImage image{path, archive, members[i].offset, members[i].size,
                      base_name(members[i].name)};
    split.images.push_back(labelled(std::move(image), id->second, labels, devkit.classes, path));
  }
  return split;
}

ImageNetDownload list_image_net_org(const fs::path& dir, int threads) {
  ImageNetDownload download{"image-net.org", {}, {}};
  const Devkit devkit = read_devkit((dir / kDevkit).string());
  download.classes = devkit.classes;
  if (fs::exists(dir / kTrainTar))
    download.splits.push_back(list_train_tar((dir / kTrainTar).string(), devkit.classes, threads));
  if (fs::exists(dir / kValTar))
    download.splits.push_back(list_val_tar((dir / kValTar).string(), devkit));
  USER_CHECK(!download.splits.empty(), dir.string(), " holds the devkit but neither ", kTrainTar,
             " nor ", kValTar);
  return download;
}

// ---- Kaggle: folders and CSV files ---------------------------------------------------------

struct Solution {
  std::string synset;  // the first box's class: the image's
  std::vector<std::array<float, 4>> boxes;
};

// LOC_*_solution.csv: "ImageId,PredictionString", each prediction "WNID xmin ymin xmax ymax ...".
std::map<std::string, Solution> read_solution_csv(const fs::path& path) {
  std::map<std::string, Solution> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  std::getline(in, line);  // the header
  for (int number = 2; std::getline(in, line); ++number) {
    const size_t comma = line.find(',');
    USER_CHECK(comma != std::string::npos, path.string(), ":", number, ": expected ImageId,",
               "PredictionString");
    Solution& s = out[line.substr(0, comma)];
    std::istringstream fields(line.substr(comma + 1));
    std::string synset;
    std::array<float, 4> box{};
    while (fields >> synset >> box[0] >> box[1] >> box[2] >> box[3]) {
      if (s.synset.empty()) s.synset = synset;
      s.boxes.push_back(box);
    }
  }
  return out;
}

ImageNetSplit list_kaggle_train(const fs::path& dir, const std::vector<ClassName>& classes) {
  const auto labels = labels_by_synset(classes);
  const auto boxes = read_solution_csv(dir / "LOC_train_solution.csv");
  ImageNetSplit split{"train", {}, kImageNetTrainImages};
  const fs::path root = dir / kKaggleData / "train";
  for (auto& image : list_image_folder(root.string())) {
    const std::string synset = image.synset;
    image = labelled(std::move(image), synset, labels, classes, (root / synset).string());
    const auto it = boxes.find(stem(image.filename));
    if (it != boxes.end()) image.boxes = it->second.boxes;
    split.images.push_back(std::move(image));
  }
  return split;
}

ImageNetSplit list_kaggle_val(const fs::path& dir, const std::vector<ClassName>& classes) {
  const fs::path csv = dir / "LOC_val_solution.csv", root = dir / kKaggleData / "val";
  USER_CHECK(fs::exists(csv), csv.string(), " is missing: the validation images' classes are ",
             "there. Fix: unpack the whole Kaggle download");
  const auto solutions = read_solution_csv(csv);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  const auto labels = labels_by_synset(classes);
  ImageNetSplit split{"validation", {}, kImageNetValidationImages};
  for (const auto& file : files) {
    const auto it = solutions.find(file.stem().string());
    USER_CHECK(it != solutions.end(), csv.string(), " gives no class for ", file.string());
    SourceImage image{file.string(), nullptr, 0, 0, file.filename().string()};
    image.boxes = it->second.boxes;
    split.images.push_back(
        labelled(std::move(image), it->second.synset, labels, classes, csv.string()));
  }
  return split;
}

ImageNetDownload list_kaggle(const fs::path& dir) {
  ImageNetDownload download{"Kaggle", read_class_names((dir / kSynsetMapping).string()), {}};
  std::sort(download.classes.begin(), download.classes.end(),
            [](const ClassName& a, const ClassName& b) { return a.synset < b.synset; });
  if (fs::is_directory(dir / kKaggleData / "train"))
    download.splits.push_back(list_kaggle_train(dir, download.classes));
  if (fs::is_directory(dir / kKaggleData / "val"))
    download.splits.push_back(list_kaggle_val(dir, download.classes));
  USER_CHECK(!download.splits.empty(), dir.string(), " holds ", kSynsetMapping, " but no ",
             kKaggleData, "/train or /val folder");
  return download;
}

}  // namespace

ImageNetDownload list_imagenet_download(const std::string& dir, int threads) {
  const fs::path root(dir);
  if (fs::exists(root / kDevkit)) return list_image_net_org(root, threads);
  if (fs::exists(root / kSynsetMapping)) return list_kaggle(root);
  throw UserError(detail::concat(
      "'", dir, "' holds neither ImageNet download: expected image-net.org's ", kDevkit, " beside ",
      kTrainTar, " and/or ", kValTar, ", or Kaggle's ", kSynsetMapping, " beside ", kKaggleData,
      "/{train,val} and LOC_val_solution.csv. Fix: point --imagenet at the folder ",
      "holding them"));
}

}  // namespace trainer
