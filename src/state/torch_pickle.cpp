#include "src/state/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "base/user_error.h"

namespace trainer {
namespace {

// Walks a pickle opcode by opcode. It knows every opcode's argument length up to protocol 5, so
// no argument byte is taken for an opcode.
class PickleWalker {
 public:
  explicit PickleWalker(const std::string& in) : in_(in) {}

  // Walks to STOP; what LibTorch's unpickler would allocate from a damaged field, or nullopt. It
  // allocates a counted argument's claimed length (up to 2^64 bytes) before reading it, and grows
  // its memo to the index a PUT names (4 bytes: 2^32 entries of 16 bytes). A pickle numbers its
  // memo entries from 0, one PUT (2 bytes at least) each, so no index reaches the pickle's size.
  // An opcode the walk does not know ends it: the unpickler stops there too.
  std::optional<std::string> find_damage() {
    while (pos_ < in_.size()) {
      const size_t start = pos_;
      const char op = in_[pos_++];
      if (!skip_argument(op)) {
        if (!truncated_) return std::nullopt;
        return "the opcode at byte " + std::to_string(start) + " claims more bytes than its " +
               std::to_string(in_.size());
      }
      if (is_put(op) && memo_index(op, start) >= in_.size())
        return "the memo index at byte " + std::to_string(start) + " is over any its " +
               std::to_string(in_.size()) + " bytes can hold";
      if (op == '.') break;  // STOP
    }
    return std::nullopt;
  }

 protected:
  static bool is_put(char op) { return op == 'q' || op == 'r' || op == 'p'; }
  static bool is_get(char op) { return op == 'h' || op == 'j' || op == 'g'; }

  uint64_t little_endian(size_t at, size_t bytes) const {
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) value |= uint64_t(uint8_t(in_[at + i])) << (8 * i);
    return value;
  }

  // The memo index of a PUT or GET opcode that starts at `start` (a text one that is not a
  // number: UINT64_MAX, which no memo holds; the unpickler reports it).
  uint64_t memo_index(char op, size_t start) const {
    if (op == 'q' || op == 'h') return little_endian(start + 1, 1);
    if (op == 'r' || op == 'j') return little_endian(start + 1, 4);
    const char* first = in_.data() + start + 1;
    const char* last = in_.data() + in_.find('\n', start);
    uint64_t index = 0;
    const auto [end, error] = std::from_chars(first, last, index);
    return error == std::errc() && end == last ? index : UINT64_MAX;
  }

  bool skip(size_t bytes) {
    if (bytes > in_.size() - pos_) return !(truncated_ = true);
    pos_ += bytes;
    return true;
  }
  bool skip_line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string::npos) return !(truncated_ = true);
    pos_ = end + 1;
    return true;
  }
  bool skip_counted(size_t length_bytes) {
    if (length_bytes > in_.size() - pos_) return !(truncated_ = true);
    const uint64_t length = little_endian(pos_, length_bytes);
    pos_ += length_bytes;
    return skip(length);
  }

  // Moves past `op`'s argument; false for an opcode pickle does not have, or a truncated one.
  bool skip_argument(char op) {
    // Opcodes by what follows them (Python's pickletools table, protocols 0 to 5).
    static constexpr std::string_view kNothing =
        "(.012NQRabd}elo]st)u\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98";
    auto is = [op](std::string_view set) { return set.find(op) != std::string_view::npos; };
    if (is(kNothing)) return true;
    if (is("FILPSVgp")) return skip_line();
    if (is("ci")) return skip_line() && skip_line();
    if (is("Khq\x80\x82")) return skip(1);
    if (is("M\x83")) return skip(2);
    if (is("Jjr\x84")) return skip(4);
    if (is("G\x95")) return skip(8);
    if (is("UC\x8a\x8c")) return skip_counted(1);  // a 1-byte length, then that many bytes
    if (is("TXB\x8b")) return skip_counted(4);
    if (is("\x8d\x8e\x96")) return skip_counted(8);
    return false;
  }

  const std::string& in_;
  size_t pos_ = 0;
  bool truncated_ = false;  // an argument reached past the end
};

// Note [OrderedDict in LibTorch's unpickler]
// torch::jit's unpickler turns collections.OrderedDict into None (it expects one only as a
// tensor's empty backward hooks), so the state dicts Python saves (an OrderedDict, plus its
// `_metadata` attribute set by BUILD) fail to load. Python pickles an OrderedDict as
// `<class> () REDUCE`, the class by GLOBAL or, once memoised, by a memo GET; its items follow
// with SETITEMS, its attributes with BUILD. So each such call becomes EMPTY_DICT (a plain dict,
// filled by the same SETITEMS) and the class's memo PUT is dropped. The unpickler has no POP to
// discard the attributes, so BUILD becomes TUPLE2, which leaves (dict, attributes) where the
// dict was, and without_attributes() takes the dict back out once the pickle is read. The walk
// knows every opcode's length up to protocol 5, so no argument byte is taken for an opcode; an
// opcode it does not know, or an OrderedDict used otherwise, leaves the pickle as it was, for
// the unpickler to report.
class OrderedDictRewriter : PickleWalker {
 public:
  explicit OrderedDictRewriter(const std::string& in) : PickleWalker(in) {}

  // The rewritten pickle, or nullopt to use the original.
  std::optional<std::string> run() {
    bool found = false;
    while (pos_ < in_.size()) {
      const size_t start = pos_;
      const char op = in_[pos_++];
      if (!skip_argument(op)) return std::nullopt;
      const std::string_view whole(in_.data() + start, pos_ - start);
      if (op == 'c' && whole == "ccollections\nOrderedDict\n") {
        found = true;
        state_ = State::kClass;
        continue;
      }
      if (state_ == State::kClass && is_put(op)) {
        class_memo_.insert(memo_index(op, start));
        continue;
      }
      if (is_get(op) && class_memo_.count(memo_index(op, start))) {
        if (state_ != State::kNone) return std::nullopt;
        state_ = State::kClass;
        continue;
      }
      if (state_ == State::kClass) {
        if (op != ')') return std::nullopt;  // OrderedDict(...) with arguments
        state_ = State::kArguments;
        continue;
      }
      if (state_ == State::kArguments) {
        if (op != 'R') return std::nullopt;
        out_ += '}';  // EMPTY_DICT
        state_ = State::kNone;
        continue;
      }
      out_ += op == 'b' ? std::string_view("\x86") : whole;  // BUILD -> TUPLE2
    }
    if (!found || state_ != State::kNone) return std::nullopt;
    return out_;
  }

 private:
  enum class State { kNone, kClass, kArguments };

  std::string out_;
  State state_ = State::kNone;
  std::set<uint64_t> class_memo_;  // memo indices holding the OrderedDict class
};

// Undoes what BUILD -> TUPLE2 left (Note [OrderedDict in LibTorch's unpickler]): each pair of a
// dict and its attributes (a dict) becomes the dict, in every container.
c10::IValue without_attributes(const c10::IValue& value) {
  if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    if (items.size() == 2 && items[0].isGenericDict() && items[1].isGenericDict())
      return without_attributes(items[0]);
    std::vector<c10::IValue> out;
    for (const auto& item : items) out.push_back(without_attributes(item));
    return c10::ivalue::Tuple::create(std::move(out));
  }
  if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    for (const auto& entry : dict)
      dict.insert_or_assign(entry.key(), without_attributes(entry.value()));
    return dict;
  }
  if (value.isList()) {
    auto list = value.toList();
    for (size_t i = 0; i < list.size(); ++i) list.set(i, without_attributes(list.get(i)));
    return list;
  }
  return value;
}

// The file's size, checked against `max_bytes` before anything of it is read.
int64_t checked_file_size(const std::string& path, int64_t max_bytes, const std::string& what) {
  std::error_code error;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, error));
  USER_CHECK(!error, what, " '", path, "' cannot be read: ", error.message());
  USER_CHECK(size <= max_bytes, what, " '", path, "' is ", size, " bytes, over the limit of ",
             max_bytes, " bytes for a ", what,
             " (a ResNet-50 checkpoint is ~300 MB, its weights ~100 MB): not a file this trainer "
             "wrote or reads. Fix: give the path of the right file");
  return size;
}

// Each entry of `archive` lies inside the file of `file_size` bytes: getRecord allocates the size
// the zip's directory claims before it reads a byte.
void check_entries(caffe2::serialize::PyTorchStreamReader& archive, int64_t file_size,
                   const std::string& path, const std::string& what) {
  for (const std::string& name : archive.getAllRecords()) {
    const size_t size = archive.getRecordSize(name);
    const size_t offset = archive.getRecordOffset(name);
    USER_CHECK(
        offset <= static_cast<size_t>(file_size) && size <= static_cast<size_t>(file_size) - offset,
        what, " '", path, "': zip entry '", name, "' at byte ", offset, " claims ", size,
        " bytes, past the file's end at ", file_size,
        ": the file is damaged or crafted. Fix: save it again with torch.save");
  }
}

// Every tensor in `value` lies inside the bytes stored for its storage (`stored`: the size of
// each record read, by its data pointer). LibTorch's unpickler sizes a storage by the element
// count the pickle claims and views a tensor by the shape it claims, checking neither.
void check_tensors(const c10::IValue& value, const std::map<const void*, size_t>& stored,
                   const std::string& path, const std::string& what) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.numel() == 0) return;
    const auto found = stored.find(t.storage().data());
    const size_t bytes = found == stored.end() ? 0 : found->second;
    USER_CHECK(t.storage().nbytes() <= bytes, what, " '", path, "': a tensor storage claims ",
               t.storage().nbytes(), " bytes but the file holds ", bytes,
               " for it: the file is damaged or crafted. Fix: save it again with torch.save");
    // The last element's byte, without overflow: the shape and strides are the pickle's word.
    uint64_t last = static_cast<uint64_t>(t.storage_offset()), step = 0;
    bool fits = t.storage_offset() >= 0;
    for (int64_t d = 0; d < t.dim() && fits; ++d)
      fits = t.stride(d) >= 0 &&
             !__builtin_mul_overflow(static_cast<uint64_t>(t.size(d) - 1),
                                     static_cast<uint64_t>(t.stride(d)), &step) &&
             !__builtin_add_overflow(last, step, &last);
    fits = fits && !__builtin_mul_overflow(last + 1, static_cast<uint64_t>(t.itemsize()), &last) &&
           last <= t.storage().nbytes();
    USER_CHECK(fits, what, " '", path, "': a tensor of shape ", t.sizes(), " and strides ",
               t.strides(), " at storage offset ", t.storage_offset(),
               " reaches past its storage of ", t.storage().nbytes(),
               " bytes: the file is damaged or crafted. Fix: save it again with torch.save");
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      check_tensors(entry.key(), stored, path, what);
      check_tensors(entry.value(), stored, path, what);
    }
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) check_tensors(item, stored, path, what);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements())
      check_tensors(item, stored, path, what);
  }
}

}  // namespace

// torch::jit::pickle_save, with tag_aggregates = false.
std::vector<char> pickle_for_python(const c10::IValue& value) {
  std::vector<char> pickle_data;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) {
        pickle_data.insert(pickle_data.end(), bytes, bytes + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_data.data(), pickle_data.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

c10::IValue read_torch_save_file(const std::string& path, int64_t max_file_bytes,
                                 const std::string& what) {
  const int64_t file_size = checked_file_size(path, max_file_bytes, what);
  caffe2::serialize::PyTorchStreamReader archive(path);
  check_entries(archive, file_size, path, what);
  const auto [data, size] = archive.getRecord("data.pkl");
  const std::string original(static_cast<const char*>(data.get()), size);
  const std::optional<std::string> damage = PickleWalker(original).find_damage();
  USER_CHECK(!damage, what, " '", path, "': in its pickle (data.pkl), ", *damage,
             ": the file is damaged or crafted. Fix: save it again with torch.save");
  const std::optional<std::string> rewritten = OrderedDictRewriter(original).run();
  const std::string& pickle = rewritten ? *rewritten : original;
  size_t read = 0;
  std::map<const void*, size_t> stored;  // the bytes read for each storage, by data pointer
  torch::jit::Unpickler unpickler(
      [&](char* buffer, size_t length) {
        length = std::min(length, pickle.size() - read);
        std::memcpy(buffer, pickle.data() + read, length);
        read += length;
        return length;
      },
      /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
      [&](const std::string& name) {
        auto record = archive.getRecord("data/" + name);
        stored[std::get<0>(record).get()] = std::get<1>(record);
        return std::move(std::get<0>(record));
      },
      at::Device(at::kCPU));
  unpickler.set_version(archive.version());
  const c10::IValue value = unpickler.parse_ivalue();
  check_tensors(value, stored, path, what);
  return rewritten ? without_attributes(value) : value;
}

}  // namespace trainer
