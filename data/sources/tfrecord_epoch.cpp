#include "data/sources/tfrecord_epoch.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "base/bounded_wait.h"
#include "base/seed.h"
#include "base/storage_calls.h"
#include "base/user_error.h"
#include "data/formats/tfrecord/file.h"

namespace trainer {

namespace {

std::mutex logged_mutex;
std::set<std::pair<std::string, int64_t>> logged;  // (file, offset) already warned about

}  // namespace

TFRecordEpoch::TFRecordEpoch(const EpochResources& resources, EpochWork work)
    : shared_(resources), options_(resources.options), work_(std::move(work)) {
  slots_.resize(work_.plan.size());
  reading_since_.resize(options_.reader_threads);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int r = 0; r < options_.reader_threads; ++r) start_thread([this, r] { read_chunks(r); });
  for (int w = 0; w < options_.decode_threads; ++w) start_thread([this] { decode_loop(); });
}

Batch TFRecordEpoch::next_batch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t index = next_batch_;
  TORCH_INTERNAL_ASSERT(index < work_.batch_count, "next_batch() called past the end of the epoch");
  if (rows_of(index) == 0) {
    // This rank's share of the epoch's short last step is empty (Note [Elastic epoch order]).
    ++next_batch_;
    const int64_t s = work_.image_size;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    return {at::empty({0, s, s, 3}, at::TensorOptions().dtype(at::kByte)), at::empty({0}, longs),
            at::empty({0}, longs)};
  }
  try {
    bounded_wait(
        batch_done_, lock,
        [&] {
          if (error_) return true;
          auto it = batches_.find(index);
          return it != batches_.end() && it->second.remaining == 0;
        },
        options_.wait_timeout,
        detail::concat("batch ", index + 1, " of ", work_.batch_count, " (epoch ", work_.epoch + 1,
                       ") from the input threads"));
  } catch (const DeadlineExceeded& e) {  // the read it waits on, when one has not returned
    const auto stuck = oldest_storage_call();
    if (!stuck) throw;
    throw DeadlineExceeded(std::string(e.what()) + ": " +
                           describe_stuck(*stuck, std::chrono::steady_clock::now()));
  }
  if (error_) std::rethrow_exception(error_);
  PendingBatch done = std::move(batches_[index]);
  batches_.erase(index);
  ++next_batch_;
  window_moved_.notify_all();
  return {done.images, done.labels, done.ids};
}

int64_t TFRecordEpoch::bad_records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bad_;
}

int TFRecordEpoch::stop() {
  int blocked = 0;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
    slot_ready_.notify_all();
    window_moved_.notify_all();
    // Polled: a read's age grows without a notification.
    const auto deadline = std::chrono::steady_clock::now() + kThreadEndTimeout;
    while (!only_stuck_readers_left() && std::chrono::steady_clock::now() < deadline)
      thread_ended_.wait_for(lock, std::chrono::milliseconds(50));
    blocked = running_;
  }
  // A reader blocked in a read that never returns (a hung network file system) would block a
  // join forever: its threads are left to the process's exit.
  for (auto& t : threads_) {
    if (blocked > 0)
      t.detach();
    else
      t.join();
  }
  threads_.clear();
  return blocked;
}

bool TFRecordEpoch::only_stuck_readers_left() const {
  const auto now = std::chrono::steady_clock::now();
  int stuck = 0;
  for (const auto& since : reading_since_)
    if (since && now - *since > kStuckRead) ++stuck;
  return running_ == stuck;
}

void TFRecordEpoch::fail(std::exception_ptr e) {
  if (!error_) error_ = e;
  stop_ = true;
  slot_ready_.notify_all();
  window_moved_.notify_all();
  batch_done_.notify_all();
}

void TFRecordEpoch::read_chunks(int reader) {
  std::vector<uint8_t> buffer;
  std::unique_ptr<ReadFile> file;
  try {
    for (size_t c = reader; c < work_.chunks.size(); c += options_.reader_threads) {
      const Chunk& chunk = work_.chunks[c];
      std::vector<Slot> results(chunk.members.size());
      {
        // Read ahead of the decoders by one batch more than they may run ahead of the consumer.
        std::unique_lock<std::mutex> lock(mutex_);
        window_moved_.wait(lock, [&] {
          return stop_ || in_window(chunk.first_position, options_.prefetch_batches + 1);
        });
        if (stop_) return;
        auto& spare = shared_.spare_payloads;
        for (size_t m = 0; m < results.size() && !spare.empty(); ++m) {
          results[m].payload = std::move(spare.back());
          spare.pop_back();
        }
      }
      const std::string& path = options_.files[chunk.file];
      reading(reader, true);
      if (!file || file->path() != path) {
        file = std::make_unique<ReadFile>(path);
        file->advise_sequential(chunk.begin, file->size() - chunk.begin);
      }
      buffer.resize(static_cast<size_t>(chunk.end - chunk.begin));
      const int64_t got = file->read_at(chunk.begin, buffer.data(), chunk.end - chunk.begin);
      reading(reader, false);
      for (size_t m = 0; m < chunk.members.size(); ++m) {
        const IndexEntry& e = shared_.indexes[chunk.file][chunk.members[m].second];
        const int64_t at = e.offset - chunk.begin;
        std::string_view payload;
        int64_t size = 0;
        const int64_t available = std::min(e.size, got - at);
        RecordStatus status = parse_record(buffer.data() + at, available, &payload, &size);
        if (status == RecordStatus::kOk && size != e.size) status = RecordStatus::kSizeMismatch;
        if (status == RecordStatus::kOk) {
          results[m].state = Slot::kReady;
          results[m].payload.assign(payload.data(), payload.size());
        } else {
          results[m].state = Slot::kBad;
          results[m].damage = {chunk.file, e.offset,
                               describe(status, buffer.data() + at, available)};
        }
      }
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t m = 0; m < chunk.members.size(); ++m)
        slots_[chunk.members[m].first] = std::move(results[m]);
      slot_ready_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    reading_since_[reader].reset();
    fail(std::current_exception());
  }
}

void TFRecordEpoch::reading(int reader, bool in_read) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (in_read)
    reading_since_[reader] = std::chrono::steady_clock::now();
  else
    reading_since_[reader].reset();
}

void TFRecordEpoch::record_bad(const Damage& damage) {
  const std::string& path = options_.files[damage.file];
  const std::string where = path + " at byte " + std::to_string(damage.offset);
  if (options_.fail_on_bad_record)
    throw UserError("bad record in " + where + ": " + damage.reason +
                    " (bad_record_policy = fail; set it to skip to drop such records)");
  ++bad_;
  {
    std::lock_guard<std::mutex> log_lock(logged_mutex);
    if (logged.insert({path, damage.offset}).second)
      spdlog::warn("skipping bad record in {}: {}", where, damage.reason);
  }
  const double limit = options_.max_bad_fraction * static_cast<double>(work_.epoch_records);
  if (static_cast<double>(bad_) > limit)
    throw UserError(detail::concat(
        bad_, " bad records in epoch ", work_.epoch, " (the last in ", where, ": ", damage.reason,
        ") exceed max_bad_fraction = ", options_.max_bad_fraction, " of ", work_.epoch_records,
        " records. Fix: verify the data with verify-tfrecords"));
}

void TFRecordEpoch::finish_batch(int64_t index, PendingBatch& batch) {
  const int64_t rows = batch.images.size(0);
  std::vector<int64_t> good;
  for (int64_t r = 0; r < rows; ++r)
    if (!batch.bad[r]) good.push_back(r);
  if (static_cast<int64_t>(good.size()) == rows) return;
  USER_CHECK(!good.empty(), "every record of batch ", index, " of epoch ", work_.epoch,
             " is bad; the data is damaged. Fix: verify it with verify-tfrecords");
  const int64_t row_bytes = batch.images[0].numel();
  auto* pixels = batch.images.data_ptr<uint8_t>();
  auto* labels = batch.labels.data_ptr<int64_t>();
  auto* ids = batch.ids.data_ptr<int64_t>();
  if (options_.training) {  // keep the batch full: stand in another image of the same batch
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
at::Tensor TFRecordEpoch::image_buffer(int64_t rows) {
  const int64_t s = work_.image_size, largest = shared_.largest_image_size;
  const int64_t capacity = rows * largest * largest * 3;  // bytes
  const auto bytes = at::TensorOptions().dtype(at::kByte).pinned_memory(options_.pin_memory);
  auto batch_view = [&](const at::Tensor& flat) {
    return flat.narrow(0, 0, rows * s * s * 3).view({rows, s, s, 3});
  };
  if (options_.pin_memory) return batch_view(at::empty({capacity}, bytes));
  auto& pool = shared_.image_pool;
  for (const at::Tensor& t : pool)  // held by the pool alone: no batch or view still uses it
    if (t.use_count() == 1 && t.storage().use_count() == 1 && t.numel() == capacity)
      return batch_view(t);
  at::Tensor fresh = at::empty({capacity}, bytes);
  if (static_cast<int64_t>(pool.size()) < options_.prefetch_batches + 4) pool.push_back(fresh);
  return batch_view(fresh);
}

Damage TFRecordEpoch::decode(int64_t p, const Slot& slot, Decoder& decoder, uint8_t* out,
                             int64_t* label_out) {
  if (slot.state != Slot::kReady) return slot.damage;
  const int64_t record = work_.record(p);
  const auto& first = shared_.first_record;
  const int file = std::upper_bound(first.begin(), first.end(), record) - first.begin() - 1;
  Damage damage{file, shared_.indexes[file][record - first[file]].offset, ""};
  std::string_view encoded;
  int64_t label = 0;
  std::string& message = decoder.error;
  // Boxes are read only for the crop that uses them (evaluation never does).
  const bool want_boxes = decoder.transform.training &&
                          decoder.transform.train_crop == TrainCrop::kDistortedBoundingBox;
  if (!decoder.parser.parse(slot.payload, &encoded, &label, &message,
                            want_boxes ? &decoder.boxes : nullptr)) {
    // The layout named: a record of another layout is "missing" the features this one reads.
    damage.reason =
        detail::concat(message, " (record_layout = ", layout_name(options_.record_layout), ")");
  } else if (label - options_.label_offset < 0 ||
             label - options_.label_offset >= options_.num_classes) {
    damage.reason = detail::concat("label ", label, " minus label_offset ", options_.label_offset,
                                   " is outside [0, num_classes = ", options_.num_classes, ")");
  } else if (!transform_image(
                 encoded, decoder.transform,
                 mix_seed(work_.epoch_seed, static_cast<uint64_t>(work_.plan[p])), out, &message,
                 want_boxes ? BoxList{decoder.boxes.data(), decoder.boxes.size()} : BoxList{})) {
    damage.reason = message;
  } else {
    *label_out = label - options_.label_offset;
  }
  return damage;
}

PendingBatch& TFRecordEpoch::pending_batch(int64_t index) {
  auto [it, inserted] = batches_.try_emplace(index);
  if (inserted) {
    const int64_t rows = rows_of(index);
    const auto pinned = at::TensorOptions().pinned_memory(options_.pin_memory);
    it->second.images = image_buffer(rows);
    it->second.labels = at::empty({rows}, pinned.dtype(at::kLong));
    it->second.ids = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
    it->second.remaining = rows;
    it->second.bad.assign(rows, false);
  }
  return it->second;
}

void TFRecordEpoch::decode_loop() {
  const int64_t b = options_.batch_size, total = static_cast<int64_t>(work_.plan.size());
  const int64_t s = work_.image_size;
  Decoder decoder(
      feature_keys(options_.record_layout));  // resolved by the source: never kAuto here
  decoder.transform = options_.transform;
  decoder.transform.training = options_.training;
  decoder.transform.image_size = static_cast<int>(s);
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    while (true) {
      window_moved_.wait(lock, [&] {
        return stop_ || next_position_ >= total ||
               in_window(next_position_, options_.prefetch_batches);
      });
      if (stop_ || next_position_ >= total) return;
      const int64_t p = next_position_++;
      const int64_t batch_index = batch_of(p), row = p - batch_index * b;
      PendingBatch& pending = pending_batch(batch_index);
      slot_ready_.wait(lock, [&] { return stop_ || slots_[p].state != Slot::kEmpty; });
      if (stop_) return;
      Slot slot = std::move(slots_[p]);
      slots_[p] = Slot();
      uint8_t* out = pending.images.data_ptr<uint8_t>() + row * s * s * 3;
      int64_t* label_out = pending.labels.data_ptr<int64_t>() + row;
      pending.ids.data_ptr<int64_t>()[row] = work_.record(p);
      lock.unlock();

      const Damage damage = decode(p, slot, decoder, out, label_out);
      lock.lock();
      if (slot.payload.capacity() > 0) shared_.spare_payloads.push_back(std::move(slot.payload));
      PendingBatch& batch = batches_[batch_index];
      if (!damage.reason.empty()) {
        batch.bad[row] = true;
        *label_out = 0;
        record_bad(damage);
      }
      if (--batch.remaining == 0) {
        finish_batch(batch_index, batch);
        batch_done_.notify_all();
      }
    }
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    fail(std::current_exception());
  }
}

}  // namespace trainer
