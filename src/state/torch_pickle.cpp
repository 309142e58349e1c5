#include "src/state/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cstring>
#include <optional>
#include <set>
#include <string_view>

namespace trainer {
namespace {

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
class OrderedDictRewriter {
 public:
  explicit OrderedDictRewriter(const std::string& in) : in_(in) {}

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

  static bool is_put(char op) { return op == 'q' || op == 'r' || op == 'p'; }
  static bool is_get(char op) { return op == 'h' || op == 'j' || op == 'g'; }

  uint64_t little_endian(size_t at, size_t bytes) const {
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) value |= uint64_t(uint8_t(in_[at + i])) << (8 * i);
    return value;
  }

  // The memo index of a PUT or GET opcode that starts at `start`.
  uint64_t memo_index(char op, size_t start) const {
    if (op == 'q' || op == 'h') return little_endian(start + 1, 1);
    if (op == 'r' || op == 'j') return little_endian(start + 1, 4);
    return std::stoull(in_.substr(start + 1, in_.find('\n', start) - start - 1));
  }

  bool skip(size_t bytes) {
    if (bytes > in_.size() - pos_) return false;
    pos_ += bytes;
    return true;
  }
  bool skip_line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string::npos) return false;
    pos_ = end + 1;
    return true;
  }
  bool skip_counted(size_t length_bytes) {
    if (length_bytes > in_.size() - pos_) return false;
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

c10::IValue read_torch_save_file(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader archive(path);
  const auto [data, size] = archive.getRecord("data.pkl");
  const std::string original(static_cast<const char*>(data.get()), size);
  const std::optional<std::string> rewritten = OrderedDictRewriter(original).run();
  const std::string& pickle = rewritten ? *rewritten : original;
  size_t read = 0;
  torch::jit::Unpickler unpickler(
      [&](char* buffer, size_t length) {
        length = std::min(length, pickle.size() - read);
        std::memcpy(buffer, pickle.data() + read, length);
        read += length;
        return length;
      },
      /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
      [&](const std::string& name) { return std::get<0>(archive.getRecord("data/" + name)); },
      at::Device(at::kCPU));
  unpickler.set_version(archive.version());
  const c10::IValue value = unpickler.parse_ivalue();
  return rewritten ? without_attributes(value) : value;
}

}  // namespace trainer
