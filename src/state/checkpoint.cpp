#include "src/state/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "base/storage_calls.h"
#include "base/user_error.h"
#include "src/state/torch_pickle.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kSuffix = ".pt";
constexpr const char* kTemporary = ".tmp.";  // checkpoint-<step>.pt.tmp.<pid> until renamed

c10::Dict<std::string, at::Tensor> to_dict(const TensorMap& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().cpu().contiguous());
  return dict;
}

TensorMap to_map(const c10::IValue& value, const std::string& what) {
  USER_CHECK(value.isGenericDict(), "checkpoint entry '", what, "' is not a dict");
  TensorMap out;
  for (const auto& entry : value.toGenericDict())
    out[entry.key().toStringRef()] = entry.value().toTensor();
  return out;
}

// A list of str as Python reads it: torch.load(weights_only=True) allows lists and str.
c10::impl::GenericList to_list(const std::vector<std::string>& items) {
  c10::impl::GenericList list(c10::StringType::get());
  for (const auto& item : items) list.push_back(item);
  return list;
}

std::vector<std::string> to_strings(const c10::IValue& value, const char* what,
                                    const std::string& source) {
  USER_CHECK(value.isList(), source, " entry '", what, "' is not a list");
  std::vector<std::string> out;
  for (const c10::IValue& item : value.toListRef()) {
    USER_CHECK(item.isString(), source, " entry '", what, "' holds something other than str");
    out.push_back(item.toStringRef());
  }
  return out;
}

void insert_classes(c10::impl::GenericDict& dict, const std::vector<ClassName>& classes) {
  if (classes.empty()) return;
  std::vector<std::string> synsets, texts;
  for (const auto& c : classes) {
    synsets.push_back(c.synset);
    texts.push_back(c.text);
  }
  dict.insert("class_synsets", to_list(synsets));
  dict.insert("class_texts", to_list(texts));
}

// write(2) the whole buffer, fsync, close: the data is on disk before the rename publishes it.
void write_file_durably(const fs::path& path, const std::vector<char>& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  USER_CHECK(fd >= 0, "cannot write checkpoint ", path, ": ", std::strerror(errno),
             ". Fix: make output_dir writable or point it at a writable volume");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw UserError("writing checkpoint " + path.string() + " failed: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  USER_CHECK(synced, "fsync of checkpoint ", path, " failed: ", std::strerror(errno));
}

void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself is already atomic
  ::fsync(fd);
  ::close(fd);
}

// checkpoint-<digits>.pt: what checkpoint_path names (another name there is not the run's).
bool is_checkpoint_name(const std::string& name) {
  const size_t prefix = std::strlen(kPrefix), suffix = std::strlen(kSuffix);
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= prefix + suffix ||
      name.substr(name.size() - suffix) != kSuffix)
    return false;
  const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<ClassName> read_checkpoint_classes(const c10::impl::GenericDict& dict,
                                               const std::string& source) {
  if (!dict.contains("class_synsets")) return {};  // the run had no class names
  const auto synsets = to_strings(dict.at("class_synsets"), "class_synsets", source);
  const auto texts = dict.contains("class_texts")
                         ? to_strings(dict.at("class_texts"), "class_texts", source)
                         : std::vector<std::string>(synsets.size());
  USER_CHECK(texts.size() == synsets.size(), source, " has ", synsets.size(), " class_synsets but ",
             texts.size(), " class_texts");
  std::vector<ClassName> out;
  for (size_t i = 0; i < synsets.size(); ++i) out.push_back({synsets[i], texts[i]});
  return out;
}

TensorMap state_dict(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach().cpu();
  for (const auto& item : module.named_buffers()) out[item.key()] = item.value().detach().cpu();
  return out;
}

std::vector<std::string> load_state_dict(torch::nn::Module& module, const TensorMap& state,
                                         const std::string& source,
                                         const std::set<std::string>& keep_if_shape_differs) {
  at::NoGradGuard no_grad;
  std::vector<std::string> kept;
  size_t found = 0;
  auto copy_into = [&](const std::string& name, at::Tensor& target) {
    auto it = state.find(name);
    USER_CHECK(it != state.end(), source, " has no entry '", name, "', which the model has",
               state.empty() ? "" : " (its first entry is '" + state.begin()->first + "')",
               ": it was saved from another architecture. Fix: set arch (and num_classes) to ",
               "those of the file");
    ++found;
    if (it->second.sizes() != target.sizes() && keep_if_shape_differs.count(name)) {
      kept.push_back(name);
      return;
    }
    USER_CHECK(it->second.sizes() == target.sizes(), source, " entry '", name, "' has shape ",
               it->second.sizes(), " but the model needs ", target.sizes(),
               ". Fix: set arch and num_classes to those of the file");
    target.copy_(it->second);
  };
  for (auto& item : module.named_parameters()) copy_into(item.key(), item.value());
  for (auto& item : module.named_buffers()) copy_into(item.key(), item.value());
  if (found != state.size()) {
    const auto params = module.named_parameters(), buffers = module.named_buffers();
    for (const auto& [name, tensor] : state)
      USER_CHECK(params.contains(name) || buffers.contains(name), source, " has an entry '", name,
                 "' the model does not have (", state.size() - found,
                 " such): it was saved from another architecture. Fix: set arch to that of the ",
                 "file");
  }
  return kept;
}

void save_checkpoint(const Checkpoint& checkpoint, const fs::path& path) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("model", to_dict(checkpoint.model));
  dict.insert("optimizer", to_dict(checkpoint.optimizer));
  if (!checkpoint.ema.empty()) dict.insert("ema", to_dict(checkpoint.ema));
  dict.insert("architecture", checkpoint.architecture);
  dict.insert("loss_scale", checkpoint.loss_scale);
  dict.insert("loss_scale_growth_tracker", checkpoint.loss_scale_growth_tracker);
  dict.insert("step", checkpoint.progress.step);
  dict.insert("epoch", checkpoint.progress.epoch);
  dict.insert("samples_in_epoch", checkpoint.progress.samples_in_epoch);
  dict.insert("eval_pending", checkpoint.progress.eval_pending);
  dict.insert("target_reached", checkpoint.progress.target_reached);
  dict.insert("world_size", checkpoint.world_size);
  dict.insert("global_batch", checkpoint.global_batch);
  dict.insert("samples_per_epoch", checkpoint.samples_per_epoch);
  dict.insert("config", checkpoint.config);
  insert_classes(dict, checkpoint.classes);
  const std::vector<char> bytes = pickle_for_python(c10::IValue(dict));

  fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + kTemporary + std::to_string(::getpid());
  try {
    write_file_durably(tmp, bytes);
  } catch (const UserError& e) {
    std::error_code ignored;  // a partial checkpoint only takes space (a full disk, most likely)
    fs::remove(tmp, ignored);
    throw UserError(std::string(e.what()) + ". The checkpoints written before are intact. Fix: " +
                    "free space on the output volume (df -h " + path.parent_path().string() +
                    "), then start the job again: it resumes from the newest");
  }
  fs::rename(tmp, path);
  fsync_directory(path.parent_path());
}

Checkpoint load_checkpoint(const fs::path& path) {
  const StorageCallScope call("reading", path.string());
  std::ifstream in(path, std::ios::binary);
  USER_CHECK(in, "cannot read checkpoint ", path, ": ", std::strerror(errno),
             ". Fix: check the path, or set resume = none to start afresh");
  c10::IValue value;
  try {
    // Sizes checked before they are read (kMaxCheckpointBytes, each entry and tensor inside it).
    value = read_torch_save_file(path.string(), kMaxCheckpointBytes, "checkpoint");
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    throw UserError("checkpoint " + path.string() + " is not a readable torch checkpoint (" +
                    std::string(e.what()).substr(0, 200) + "). Fix: resume from another one");
  }
  USER_CHECK(value.isGenericDict(), "checkpoint ", path, " does not hold a dict");
  auto dict = value.toGenericDict();
  for (const char* key :
       {"model", "optimizer", "loss_scale", "loss_scale_growth_tracker", "step", "epoch",
        "samples_in_epoch", "world_size", "global_batch", "samples_per_epoch", "config"})
    USER_CHECK(dict.contains(key), "checkpoint ", path, " has no '", key,
               "' entry: it was not written by this trainer, or by a version that did not count ",
               "progress in images. Fix: resume = none to start afresh");
  Checkpoint out;
  out.model = to_map(dict.at("model"), "model");
  out.optimizer = to_map(dict.at("optimizer"), "optimizer");
  if (dict.contains("ema")) out.ema = to_map(dict.at("ema"), "ema");
  // Absent from checkpoints of earlier versions, which had no variants: the config's arch.
  if (dict.contains("architecture")) out.architecture = dict.at("architecture").toStringRef();
  out.loss_scale = dict.at("loss_scale").toDouble();
  out.loss_scale_growth_tracker = dict.at("loss_scale_growth_tracker").toInt();
  out.progress.step = dict.at("step").toInt();
  out.progress.epoch = dict.at("epoch").toInt();
  out.progress.samples_in_epoch = dict.at("samples_in_epoch").toInt();
  // Absent from checkpoints of earlier versions, which never left an evaluation for later.
  out.progress.eval_pending = dict.contains("eval_pending") && dict.at("eval_pending").toBool();
  out.progress.target_reached =
      dict.contains("target_reached") && dict.at("target_reached").toBool();
  out.world_size = dict.at("world_size").toInt();
  out.global_batch = dict.at("global_batch").toInt();
  out.samples_per_epoch = dict.at("samples_per_epoch").toInt();
  out.config = dict.at("config").toStringRef();
  out.classes = read_checkpoint_classes(dict, "checkpoint " + path.string());
  return out;
}

fs::path checkpoint_path(const fs::path& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%09lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return dir / name;
}

bool is_checkpoint_file_name(const fs::path& path) {
  return is_checkpoint_name(path.filename().string());
}

std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  const StorageCallScope call("listing", dir.string());
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && is_checkpoint_name(entry.path().filename().string()))
      out.push_back(entry.path());
  std::sort(out.begin(), out.end());  // zero-padded steps: lexical order is step order
  return out;
}

int64_t checkpoint_step(const fs::path& path) {
  const std::string name = path.filename().string();
  TORCH_INTERNAL_ASSERT(is_checkpoint_name(name), "not a checkpoint name: ", name);
  return std::stoll(name.substr(std::strlen(kPrefix)));
}

std::optional<fs::path> newest_checkpoint(const fs::path& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

int remove_unfinished_checkpoints(const fs::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name.find(std::string(kSuffix) + kTemporary) != name.npos)
      removed += fs::remove(entry.path(), ec) ? 1 : 0;
  }
  return removed;
}

void prune_checkpoints(const fs::path& dir, int64_t keep) {
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove(all[i]);
}

}  // namespace trainer
