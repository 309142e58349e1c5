#include "data/sources/tfrecord_source.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <opencv2/core/utility.hpp>
#include <set>
#include <thread>

#include "base/bounded_wait.h"
#include "base/check.h"
#include "base/seed.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/sources/epoch_plan.h"
#include "data/sources/step_shares.h"

namespace trainer {
namespace {

// How long stopping an epoch waits for its threads (they end within one decode once told).
constexpr std::chrono::seconds kThreadEndTimeout{10};

// Damage found in one record: where, and why.
struct Damage {
  int file = 0;
  int64_t offset = 0;
  std::string reason;
};

// A payload handed from a reader to a decode worker.
struct Slot {
  enum State { kEmpty, kReady, kBad } state = kEmpty;
  std::string payload;
  Damage damage;
};

// A contiguous byte range of one file holding records this rank needs, read with one pread.
struct Chunk {
  int file = 0;
  int64_t begin = 0, end = 0;  // byte range
  int64_t first_position = 0;  // earliest plan position that needs it: read in this order
  std::vector<std::pair<int64_t, int64_t>> members;  // (plan position, record in file)
};

struct PendingBatch {
  at::Tensor images;  // (B, S, S, 3) uint8, pinned when the device is a GPU; S: the epoch's crop
  at::Tensor labels;  // (B) int64
  at::Tensor ids;     // (B) int64: the record each row was decoded from
  int64_t remaining = 0;
  std::vector<bool> bad;  // rows whose record was skipped
};

}  // namespace

struct TFRecordSource::Epoch {
  TFRecordSource* source;
  const TFRecordSourceOptions& o;
  int64_t epoch = 0;
  uint64_t epoch_seed = 0;
  int64_t image_size = 0;     // this epoch's crop, pixels (Note [Image size per epoch])
  std::vector<int64_t> plan;  // this rank's global record ids from the start position on
  int64_t batch_count = 0;  // batches to yield: one per step when training (the last may be empty)
  int64_t epoch_records = 0;  // this rank's share of a whole epoch, for max_bad_fraction
  std::vector<Slot> slots;    // one per plan position
  std::vector<Chunk> chunks;  // in first_position order

  std::mutex mutex;
  std::condition_variable slot_ready, window_moved, batch_done, thread_ended;
  int64_t next_batch = 0;     // the batch the consumer takes next (relative to the plan)
  int64_t next_position = 0;  // the next plan position a decode worker claims
  std::map<int64_t, PendingBatch> batches;
  int64_t bad = 0;
  bool stop = false;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  int running = 0;  // threads not yet ended

  Epoch(TFRecordSource* s, const TFRecordSourceOptions& options) : source(s), o(options) {}

  // The batch that plan position `p` belongs to, and a batch's rows: every batch holds
  // batch_size but the last, which holds the rest (Note [Elastic epoch order]): fewer, none, or
  // one more than batch_size.
  int64_t batch_of(int64_t p) const { return std::min(p / o.batch_size, batch_count - 1); }
  int64_t rows_of(int64_t batch) const {
    return batch < batch_count - 1 ? o.batch_size
                                   : static_cast<int64_t>(plan.size()) - batch * o.batch_size;
  }
  // Whether plan position `p` may be worked on now: its batch is among the `ahead` batches from
  // the one the consumer takes next. Counted in batches, not positions, so that every row of a
  // last batch longer than batch_size is inside the window when its batch is.
  bool in_window(int64_t p, int64_t ahead) const { return batch_of(p) < next_batch + ahead; }
  void fail(std::exception_ptr e);
  template <typename Work>
  void start_thread(Work work);
  void read_chunks(int reader);
  void decode_loop();
  void record_bad(const Damage& damage);  // called with `mutex` held
  void finish_batch(int64_t index, PendingBatch& batch);
  at::Tensor image_buffer(int64_t rows);
};

namespace {

std::mutex logged_mutex;
std::set<std::pair<std::string, int64_t>> logged;  // (file, offset) already warned about

}  // namespace

template <typename Work>
void TFRecordSource::Epoch::start_thread(Work work) {
  ++running;
  threads.emplace_back([this, work] {
    work();
    std::lock_guard<std::mutex> lock(mutex);
    --running;
    thread_ended.notify_all();
  });
}

void TFRecordSource::Epoch::fail(std::exception_ptr e) {
  if (!error) error = e;
  stop = true;
  slot_ready.notify_all();
  window_moved.notify_all();
  batch_done.notify_all();
}

void TFRecordSource::Epoch::read_chunks(int reader) {
  std::vector<uint8_t> buffer;
  std::unique_ptr<ReadFile> file;
  try {
    for (size_t c = reader; c < chunks.size(); c += o.reader_threads) {
      const Chunk& chunk = chunks[c];
      std::vector<Slot> results(chunk.members.size());
      {
        // Read ahead of the decoders by one batch more than they may run ahead of the consumer.
        std::unique_lock<std::mutex> lock(mutex);
        window_moved.wait(
            lock, [&] { return stop || in_window(chunk.first_position, o.prefetch_batches + 1); });
        if (stop) return;
        auto& spare = source->spare_payloads_;
        for (size_t m = 0; m < results.size() && !spare.empty(); ++m) {
          results[m].payload = std::move(spare.back());
          spare.pop_back();
        }
      }
      const std::string& path = o.files[chunk.file];
      if (!file || file->path() != path) {
        file = std::make_unique<ReadFile>(path);
        file->advise_sequential(chunk.begin, file->size() - chunk.begin);
      }
      buffer.resize(static_cast<size_t>(chunk.end - chunk.begin));
      const int64_t got = file->read_at(chunk.begin, buffer.data(), chunk.end - chunk.begin);
      for (size_t m = 0; m < chunk.members.size(); ++m) {
        const IndexEntry& e = source->indexes_[chunk.file][chunk.members[m].second];
        const int64_t at = e.offset - chunk.begin;
        std::string_view payload;
        int64_t size = 0;
        RecordStatus status =
            parse_record(buffer.data() + at, std::min(e.size, got - at), &payload, &size);
        if (status == RecordStatus::kOk && size != e.size) status = RecordStatus::kSizeMismatch;
        if (status == RecordStatus::kOk) {
          results[m].state = Slot::kReady;
          results[m].payload.assign(payload.data(), payload.size());
        } else {
          results[m].state = Slot::kBad;
          results[m].damage = {chunk.file, e.offset, to_string(status)};
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      for (size_t m = 0; m < chunk.members.size(); ++m)
        slots[chunk.members[m].first] = std::move(results[m]);
      slot_ready.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex);
    fail(std::current_exception());
  }
}

void TFRecordSource::Epoch::record_bad(const Damage& damage) {
  const std::string& path = o.files[damage.file];
  const std::string where = path + " at byte " + std::to_string(damage.offset);
  if (o.fail_on_bad_record)
    throw UserError("bad record in " + where + ": " + damage.reason +
                    " (bad_record_policy = fail; set it to skip to drop such records)");
  ++bad;
  {
    std::lock_guard<std::mutex> log_lock(logged_mutex);
    if (logged.insert({path, damage.offset}).second)
      spdlog::warn("skipping bad record in {}: {}", where, damage.reason);
  }
  const double limit = o.max_bad_fraction * static_cast<double>(epoch_records);
  if (static_cast<double>(bad) > limit)
    throw UserError(
        detail::concat(bad, " bad records in epoch ", epoch, " (the last in ", where, ": ",
                       damage.reason, ") exceed max_bad_fraction = ", o.max_bad_fraction, " of ",
                       epoch_records, " records. Fix: verify the data with verify-tfrecords"));
}

void TFRecordSource::Epoch::finish_batch(int64_t index, PendingBatch& batch) {
  const int64_t rows = batch.images.size(0);
  std::vector<int64_t> good;
  for (int64_t r = 0; r < rows; ++r)
    if (!batch.bad[r]) good.push_back(r);
  if (static_cast<int64_t>(good.size()) == rows) return;
  USER_CHECK(!good.empty(), "every record of batch ", index, " of epoch ", epoch,
             " is bad; the data is damaged. Fix: verify it with verify-tfrecords");
  const int64_t row_bytes = batch.images[0].numel();
  auto* pixels = batch.images.data_ptr<uint8_t>();
  auto* labels = batch.labels.data_ptr<int64_t>();
  auto* ids = batch.ids.data_ptr<int64_t>();
  if (o.training) {  // keep the batch full: stand in another image of the same batch
    for (int64_t r = 0, k = 0; r < rows; ++r) {
      if (!batch.bad[r]) continue;
      const int64_t from = good[k++ % good.size()];
      std::memcpy(pixels + r * row_bytes, pixels + from * row_bytes, row_bytes);
      labels[r] = labels[from];
      ids[r] = ids[from];
    }
    return;
  }
  for (size_t k = 0; k < good.size(); ++k) {  // evaluation: drop the row, count nothing twice
    std::memmove(pixels + k * row_bytes, pixels + good[k] * row_bytes, row_bytes);
    labels[k] = labels[good[k]];
    ids[k] = ids[good[k]];
  }
  batch.images = batch.images.narrow(0, 0, static_cast<int64_t>(good.size()));
  batch.labels = batch.labels.narrow(0, 0, static_cast<int64_t>(good.size()));
  batch.ids = batch.ids.narrow(0, 0, static_cast<int64_t>(good.size()));
}

// Note [Recycled buffers]
// A fresh allocation of a record (~110 KB) or a batch (~40 MB) is an mmap, or heap growth,
// whose every page faults when it is first written: about a tenth of a decode thread's time.
// So the buffers are recycled for the life of the source. Record payloads: the decoders hand
// their buffers back and the readers copy the next records into them. Pageable batch buffers:
// reused once nothing but the pool refers to them (the consumer has dropped the batch and every
// view of it). Pinned ones come from LibTorch's caching host allocator instead, which reuses a
// block only after the asynchronous copies reading it have finished. Both pools are bounded by
// what is in flight at once, so host memory stays flat from epoch to epoch.
// With progressive resizing (Note [Image size per epoch]) every batch buffer is sized for the
// run's largest crop and a batch is a view of its first rows x S x S x 3 bytes: the same buffers
// serve every epoch, nothing is allocated when the size changes, and the pinned blocks are all of
// one size (the caching allocator keeps every block it made; a set per size would add up).
at::Tensor TFRecordSource::Epoch::image_buffer(int64_t rows) {
  const int64_t s = image_size, largest = source->largest_image_size();
  const int64_t capacity = rows * largest * largest * 3;  // bytes
  const auto options = at::TensorOptions().dtype(at::kByte).pinned_memory(o.pin_memory);
  auto batch_view = [&](const at::Tensor& flat) {
    return flat.narrow(0, 0, rows * s * s * 3).view({rows, s, s, 3});
  };
  if (o.pin_memory) return batch_view(at::empty({capacity}, options));
  auto& pool = source->image_pool_;
  for (const at::Tensor& t : pool)  // held by the pool alone: no batch or view still uses it
    if (t.use_count() == 1 && t.storage().use_count() == 1 && t.numel() == capacity)
      return batch_view(t);
  at::Tensor fresh = at::empty({capacity}, options);
  if (static_cast<int64_t>(pool.size()) < o.prefetch_batches + 4) pool.push_back(fresh);
  return batch_view(fresh);
}

void TFRecordSource::Epoch::decode_loop() {
  const int64_t b = o.batch_size, total = static_cast<int64_t>(plan.size());
  const int64_t s = image_size;
  TransformOptions transform = o.transform;
  transform.training = o.training;
  transform.image_size = static_cast<int>(s);
  ImageFeatureParser parser;
  std::string_view encoded;
  int64_t label = 0;
  std::string error;
  std::unique_lock<std::mutex> lock(mutex);
  try {
    while (true) {
      window_moved.wait(lock, [&] {
        return stop || next_position >= total || in_window(next_position, o.prefetch_batches);
      });
      if (stop || next_position >= total) return;
      const int64_t p = next_position++;
      const int64_t batch_index = batch_of(p), row = p - batch_index * b;
      auto [it, inserted] = batches.try_emplace(batch_index);
      if (inserted) {
        const int64_t rows = rows_of(batch_index);
        const auto pinned = at::TensorOptions().pinned_memory(o.pin_memory);
        it->second.images = image_buffer(rows);
        it->second.labels = at::empty({rows}, pinned.dtype(at::kLong));
        it->second.ids = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
        it->second.remaining = rows;
        it->second.bad.assign(rows, false);
      }
      slot_ready.wait(lock, [&] { return stop || slots[p].state != Slot::kEmpty; });
      if (stop) return;
      Slot slot = std::move(slots[p]);
      slots[p] = Slot();
      uint8_t* out = it->second.images.data_ptr<uint8_t>() + row * s * s * 3;
      int64_t* label_out = it->second.labels.data_ptr<int64_t>() + row;
      it->second.ids.data_ptr<int64_t>()[row] = plan[p];
      lock.unlock();

      Damage damage = slot.damage;
      if (slot.state == Slot::kReady) {
        const int64_t record = plan[p];
        const int file =
            std::upper_bound(source->first_record_.begin(), source->first_record_.end(), record) -
            source->first_record_.begin() - 1;
        damage = {file, source->indexes_[file][record - source->first_record_[file]].offset, ""};
        if (!parser.parse(slot.payload, &encoded, &label, &error)) {
          damage.reason = error;
        } else if (label - o.label_offset < 0 || label - o.label_offset >= o.num_classes) {
          damage.reason = detail::concat("label ", label, " minus label_offset ", o.label_offset,
                                         " is outside [0, num_classes = ", o.num_classes, ")");
        } else if (!transform_image(encoded, transform,
                                    mix_seed(epoch_seed, static_cast<uint64_t>(record)), out,
                                    &error)) {
          damage.reason = error;
        } else {
          *label_out = label - o.label_offset;
        }
      }
      lock.lock();
      if (slot.payload.capacity() > 0) source->spare_payloads_.push_back(std::move(slot.payload));
      PendingBatch& batch = batches[batch_index];
      if (!damage.reason.empty()) {
        batch.bad[row] = true;
        *label_out = 0;
        record_bad(damage);
      }
      if (--batch.remaining == 0) {
        finish_batch(batch_index, batch);
        batch_done.notify_all();
      }
    }
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    fail(std::current_exception());
  }
}

TFRecordSource::TFRecordSource(TFRecordSourceOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  USER_CHECK(!o.files.empty(), "no TFRecord files given");
  USER_CHECK(o.batch_size > 0, "batch_size must be > 0, got ", o.batch_size);
  TORCH_INTERNAL_ASSERT(o.world_size > 0 && o.rank >= 0 && o.rank < o.world_size);
  TORCH_INTERNAL_ASSERT(o.reader_threads > 0 && o.decode_threads > 0 && o.prefetch_batches > 0);
  // The pool below is the parallelism: OpenCV's own threads inside each resize would only
  // compete with it for the rank's cores.
  cv::setNumThreads(1);
  std::vector<BadRecord> damage;
  first_record_.assign(1, 0);
  for (const auto& file : o.files) {
    indexes_.push_back(load_or_build_index(file, o.index_cache_dir, &damage));
    first_record_.push_back(first_record_.back() + static_cast<int64_t>(indexes_.back().size()));
  }
  for (const auto& d : damage) {
    USER_CHECK(!o.fail_on_bad_record, "damaged TFRecord file ", d.file, " at byte ", d.offset, ": ",
               d.reason, " (bad_record_policy = fail). Fix: re-create or remove the file");
    spdlog::warn(
        "TFRecord file {} is damaged at byte {} ({}); its records from there on are "
        "skipped",
        d.file, d.offset, d.reason);
  }
  index_bad_ = static_cast<int64_t>(damage.size());
  USER_CHECK(index_bad_ <= o.max_bad_fraction * std::max<int64_t>(1, total_records()), index_bad_,
             " damaged TFRecord files exceed max_bad_fraction = ", o.max_bad_fraction,
             ". Fix: verify the data with verify-tfrecords");
  const int64_t needed = o.training ? o.batch_size * o.world_size : o.world_size;
  USER_CHECK(total_records() >= needed, "the TFRecord files (", o.files.front(), " ... ",
             o.files.size(), " files) hold ", total_records(), " records, fewer than ", needed,
             " (batch_size x ranks for training; one per rank for evaluation). ",
             "Fix: lower batch_size or use more data");
  start_epoch(0);
}

TFRecordSource::~TFRecordSource() { stop_epoch(); }

int64_t TFRecordSource::total_records() const { return first_record_.back(); }

int64_t TFRecordSource::image_size_of(int64_t epoch) const {
  const auto& sizes = options_.image_sizes;
  return options_.training && sizes ? sizes->at(epoch) : options_.transform.image_size;
}

int64_t TFRecordSource::largest_image_size() const {
  const auto& sizes = options_.image_sizes;
  return options_.training && sizes ? sizes->largest() : options_.transform.image_size;
}

int64_t TFRecordSource::bad_records() const {
  return index_bad_ + bad_in_past_epochs_ + (epoch_ ? epoch_->bad : 0);
}

int64_t TFRecordSource::batches_left() const { return epoch_->batch_count - epoch_->next_batch; }

void TFRecordSource::stop_epoch() {
  if (!epoch_) return;
  bool ended = false;
  {
    std::unique_lock<std::mutex> lock(epoch_->mutex);
    epoch_->stop = true;
    epoch_->slot_ready.notify_all();
    epoch_->window_moved.notify_all();
    ended = epoch_->thread_ended.wait_for(lock, kThreadEndTimeout,
                                          [&] { return epoch_->running == 0; });
  }
  bad_in_past_epochs_ += epoch_->bad;
  if (!ended) {
    // A reader blocked in a read that never returns (a hung network file system) would block a
    // join forever: leave the threads, and the epoch they use, to the process's exit.
    spdlog::warn(
        "{} input thread(s) still blocked {} s after the epoch was stopped (a read of {} "
        "that does not return?); leaving them",
        epoch_->running, kThreadEndTimeout.count(), options_.files.front());
    for (auto& t : epoch_->threads) t.detach();
    epoch_.release();
    return;
  }
  for (auto& t : epoch_->threads) t.join();
  epoch_.reset();
}

void TFRecordSource::start_epoch(int64_t epoch, int64_t position) {
  stop_epoch();
  const auto& o = options_;
  auto e = std::make_unique<Epoch>(this, options_);
  e->epoch = epoch;
  e->epoch_seed = mix_seed(o.seed, static_cast<uint64_t>(epoch));
  e->image_size = image_size_of(epoch);
  RecordTable table({});
  table.first_record = first_record_;
  PlanOptions plan{o.training,      o.seed, o.batch_size, o.shuffle_buffer,
                   o.block_records, o.rank, o.world_size};
  TORCH_INTERNAL_ASSERT(o.training || position == 0, "evaluation always starts at 0");
  e->plan = rank_plan(table, plan, epoch, position);
  const int64_t b = o.batch_size, planned = static_cast<int64_t>(e->plan.size());
  e->batch_count =
      o.training ? steps_left(total_records(), position, b * o.world_size) : (planned + b - 1) / b;
  e->epoch_records = o.training ? total_records() / o.world_size : planned;
  e->slots.resize(e->plan.size());

  // Group this rank's records by (file, block) into chunks, ordered by when they are first
  // needed; each chunk's byte range spans only the records this rank takes from the block.
  std::map<std::pair<int, int64_t>, size_t> chunk_of;
  for (int64_t p = 0; p < static_cast<int64_t>(e->plan.size()); ++p) {
    const int64_t record = e->plan[p];
    const int file = table.file_of(record);
    const int64_t local = record - first_record_[file];
    const auto key = std::make_pair(file, local / std::max<int64_t>(1, o.block_records));
    auto [it, inserted] = chunk_of.try_emplace(key, e->chunks.size());
    const IndexEntry& entry = indexes_[file][local];
    if (inserted) e->chunks.push_back({file, entry.offset, entry.offset + entry.size, p, {}});
    Chunk& chunk = e->chunks[it->second];
    chunk.begin = std::min(chunk.begin, entry.offset);
    chunk.end = std::max(chunk.end, entry.offset + entry.size);
    chunk.members.emplace_back(p, local);
  }
  Epoch* raw = e.get();
  std::lock_guard<std::mutex> lock(e->mutex);
  for (int r = 0; r < o.reader_threads; ++r) e->start_thread([raw, r] { raw->read_chunks(r); });
  for (int w = 0; w < o.decode_threads; ++w) e->start_thread([raw] { raw->decode_loop(); });
  epoch_ = std::move(e);
}

Batch TFRecordSource::next_batch() {
  Epoch& e = *epoch_;
  std::unique_lock<std::mutex> lock(e.mutex);
  const int64_t index = e.next_batch;
  TORCH_INTERNAL_ASSERT(index < e.batch_count, "next_batch() called past the end of the epoch");
  if (e.rows_of(index) == 0) {
    // This rank's share of the epoch's short last step is empty (Note [Elastic epoch order]).
    ++e.next_batch;
    const int64_t s = e.image_size;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    return {at::empty({0, s, s, 3}, at::TensorOptions().dtype(at::kByte)), at::empty({0}, longs),
            at::empty({0}, longs)};
  }
  bounded_wait(
      e.batch_done, lock,
      [&] {
        if (e.error) return true;
        auto it = e.batches.find(index);
        return it != e.batches.end() && it->second.remaining == 0;
      },
      options_.wait_timeout,
      detail::concat("batch ", index + 1, " of ", e.batch_count, " (epoch ", e.epoch + 1,
                     ") from the input threads reading ", options_.files.front(), " ..."));
  if (e.error) std::rethrow_exception(e.error);
  PendingBatch done = std::move(e.batches[index]);
  e.batches.erase(index);
  ++e.next_batch;
  e.window_moved.notify_all();
  return {done.images, done.labels, done.ids};
}

}  // namespace trainer
