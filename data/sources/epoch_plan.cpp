#include "data/sources/epoch_plan.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "base/seed.h"
#include "base/user_error.h"
#include "data/sources/step_shares.h"

namespace trainer {

RecordTable::RecordTable(const std::vector<int64_t>& records_per_file) {
  first_record.assign(1, 0);
  for (int64_t n : records_per_file) first_record.push_back(first_record.back() + n);
}

int RecordTable::file_of(int64_t record) const {
  auto it = std::upper_bound(first_record.begin(), first_record.end(), record);
  return static_cast<int>(it - first_record.begin()) - 1;
}

namespace {

// Draws uniformly from [0, n) (std::uniform_int_distribution differs between standard
// libraries; this does not, so the order is the same wherever the trainer is built).
int64_t draw(std::mt19937_64& rng, int64_t n) {
  return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
}

template <typename T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i)
    std::swap(v[i], v[draw(rng, i + 1)]);
}

// tf.data-style shuffle buffer: keep `size` records, emit a random one, refill from the stream.
std::vector<int64_t> apply_shuffle_buffer(const std::vector<int64_t>& stream, int64_t size,
                                          std::mt19937_64& rng) {
  std::vector<int64_t> out, buffer;
  out.reserve(stream.size());
  size_t next = 0;
  while (next < stream.size() && static_cast<int64_t>(buffer.size()) < size)
    buffer.push_back(stream[next++]);
  while (!buffer.empty()) {
    const int64_t pick = draw(rng, static_cast<int64_t>(buffer.size()));
    out.push_back(buffer[pick]);
    if (next < stream.size()) {
      buffer[pick] = stream[next++];
    } else {
      buffer[pick] = buffer.back();
      buffer.pop_back();
    }
  }
  return out;
}

// Records [first, end) cut at the block boundaries of their files: [begin, end) pieces.
std::vector<std::pair<int64_t, int64_t>> pieces_of(const RecordTable& table, int64_t first,
                                                   int64_t end, int64_t block) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int64_t r = first; r < end;) {
    const int f = table.file_of(r);
    const int64_t file_first = table.first_record[f];
    const int64_t block_end = file_first + ((r - file_first) / block + 1) * block;
    const int64_t piece_end = std::min({end, table.first_record[f + 1], block_end});
    pieces.emplace_back(r, piece_end);
    r = piece_end;
  }
  return pieces;
}

// The by-node order of an epoch: Note [Records by node].
std::vector<int64_t> by_node_order(const RecordTable& table, const PlanOptions& o,
                                   std::mt19937_64& rng) {
  const int64_t total = table.total(), groups = std::min(kNodeGroups, total);
  const int64_t block = std::max<int64_t>(1, o.block_records);
  std::vector<std::vector<int64_t>> streams(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    auto pieces = pieces_of(table, g * total / groups, (g + 1) * total / groups, block);
    shuffle(pieces, rng);
    for (const auto& [begin, end] : pieces) {
      std::vector<int64_t> records(static_cast<size_t>(end - begin));
      std::iota(records.begin(), records.end(), begin);
      shuffle(records, rng);
      streams[g].insert(streams[g].end(), records.begin(), records.end());
    }
  }
  // Each round takes the groups in bit-reversed order: any run of positions, a step whatever its
  // size, then holds records spread evenly over the groups, and so over the ranks' id ranges.
  std::vector<int64_t> visit;
  int bits = 0;
  while ((int64_t{1} << bits) < groups) ++bits;
  for (int64_t i = 0; i < (int64_t{1} << bits); ++i) {
    int64_t reversed = 0;
    for (int b = 0; b < bits; ++b) reversed |= ((i >> b) & 1) << (bits - 1 - b);
    if (reversed < groups) visit.push_back(reversed);
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(total));
  for (size_t i = 0; static_cast<int64_t>(order.size()) < total; ++i)
    for (int64_t g : visit)
      if (i < streams[g].size()) order.push_back(streams[g][i]);
  return order;
}

}  // namespace

std::vector<int64_t> global_order(const RecordTable& table, const PlanOptions& o, int64_t epoch) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(table.total()));
  if (!o.training) {
    for (int64_t i = 0; i < table.total(); ++i) order.push_back(i);
    return order;
  }
  std::mt19937_64 rng(mix_seed(o.seed, static_cast<uint64_t>(epoch)));
  if (o.repetitions > 1) {  // Note [Repeated augmentation]
    PlanOptions once = o;
    once.repetitions = 1;
    const std::vector<int64_t> records = global_order(table, once, epoch);
    for (int64_t j = 0; j < table.total(); ++j)
      order.push_back(records[j / o.repetitions] * o.repetitions + j % o.repetitions);
    return order;
  }
  if (o.order == EpochOrder::kByNode) return by_node_order(table, o, rng);
  const int files = static_cast<int>(table.first_record.size()) - 1;
  std::vector<int> file_order(files);
  std::iota(file_order.begin(), file_order.end(), 0);
  shuffle(file_order, rng);
  const int64_t block = std::max<int64_t>(1, o.block_records);
  for (int f : file_order) {
    const int64_t first = table.first_record[f], count = table.first_record[f + 1] - first;
    std::vector<int64_t> blocks((count + block - 1) / block);
    std::iota(blocks.begin(), blocks.end(), 0);
    shuffle(blocks, rng);
    for (int64_t b : blocks) {
      std::vector<int64_t> records;
      for (int64_t i = b * block; i < std::min(count, (b + 1) * block); ++i)
        records.push_back(first + i);
      shuffle(records, rng);
      order.insert(order.end(), records.begin(), records.end());
    }
  }
  if (o.shuffle_buffer > 1) order = apply_shuffle_buffer(order, o.shuffle_buffer, rng);
  return order;
}

std::vector<int64_t> rank_plan(const RecordTable& table, const PlanOptions& o, int64_t epoch,
                               int64_t position) {
  TORCH_INTERNAL_ASSERT(o.world_size > 0 && o.rank >= 0 && o.rank < o.world_size);
  TORCH_INTERNAL_ASSERT(o.batch_size > 0);
  std::vector<int64_t> order = global_order(table, o, epoch);
  if (o.training) {
    order.resize(static_cast<size_t>(epoch_end(table.total(), position, o.whole_steps_of)));
    return rank_samples(order, position, o.batch_size, o.rank, o.world_size, o.repetitions);
  }
  // Evaluation: slices of total / world, the first total % world one longer.
  const int64_t base = table.total() / o.world_size, extra = table.total() % o.world_size;
  const int64_t begin = o.rank * base + std::min<int64_t>(o.rank, extra);
  return std::vector<int64_t>(order.begin() + begin,
                              order.begin() + begin + base + (o.rank < extra ? 1 : 0));
}

}  // namespace trainer
