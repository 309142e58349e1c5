#include "data/sources/tfrecord_epoch.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "base/seed.h"
#include "base/user_error.h"
#include "data/formats/tfrecord/file.h"

namespace trainer {

namespace {

std::mutex logged_mutex;
std::set<std::pair<std::string, int64_t>> logged;  // (file, offset) already warned about

}  // namespace

void TFRecordEpoch::fail(std::exception_ptr e) {
  if (!error) error = e;
  stop = true;
  slot_ready.notify_all();
  window_moved.notify_all();
  batch_done.notify_all();
}

void TFRecordEpoch::read_chunks(int reader) {
  std::vector<uint8_t> buffer;
  std::unique_ptr<ReadFile> file;
  try {
    for (size_t c = reader; c < chunks.size(); c += options.reader_threads) {
      const Chunk& chunk = chunks[c];
      std::vector<Slot> results(chunk.members.size());
      {
        // Read ahead of the decoders by one batch more than they may run ahead of the consumer.
        std::unique_lock<std::mutex> lock(mutex);
        window_moved.wait(lock, [&] {
          return stop || in_window(chunk.first_position, options.prefetch_batches + 1);
        });
        if (stop) return;
        auto& spare = shared.spare_payloads;
        for (size_t m = 0; m < results.size() && !spare.empty(); ++m) {
          results[m].payload = std::move(spare.back());
          spare.pop_back();
        }
      }
      const std::string& path = options.files[chunk.file];
      if (!file || file->path() != path) {
        file = std::make_unique<ReadFile>(path);
        file->advise_sequential(chunk.begin, file->size() - chunk.begin);
      }
      buffer.resize(static_cast<size_t>(chunk.end - chunk.begin));
      const int64_t got = file->read_at(chunk.begin, buffer.data(), chunk.end - chunk.begin);
      for (size_t m = 0; m < chunk.members.size(); ++m) {
        const IndexEntry& e = shared.indexes[chunk.file][chunk.members[m].second];
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

void TFRecordEpoch::record_bad(const Damage& damage) {
  const std::string& path = options.files[damage.file];
  const std::string where = path + " at byte " + std::to_string(damage.offset);
  if (options.fail_on_bad_record)
    throw UserError("bad record in " + where + ": " + damage.reason +
                    " (bad_record_policy = fail; set it to skip to drop such records)");
  ++bad;
  {
    std::lock_guard<std::mutex> log_lock(logged_mutex);
    if (logged.insert({path, damage.offset}).second)
      spdlog::warn("skipping bad record in {}: {}", where, damage.reason);
  }
  const double limit = options.max_bad_fraction * static_cast<double>(epoch_records);
  if (static_cast<double>(bad) > limit)
    throw UserError(detail::concat(
        bad, " bad records in epoch ", epoch, " (the last in ", where, ": ", damage.reason,
        ") exceed max_bad_fraction = ", options.max_bad_fraction, " of ", epoch_records,
        " records. Fix: verify the data with verify-tfrecords"));
}

void TFRecordEpoch::finish_batch(int64_t index, PendingBatch& batch) {
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
  if (options.training) {  // keep the batch full: stand in another image of the same batch
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
  const int64_t s = image_size, largest = shared.largest_image_size;
  const int64_t capacity = rows * largest * largest * 3;  // bytes
  const auto bytes = at::TensorOptions().dtype(at::kByte).pinned_memory(options.pin_memory);
  auto batch_view = [&](const at::Tensor& flat) {
    return flat.narrow(0, 0, rows * s * s * 3).view({rows, s, s, 3});
  };
  if (options.pin_memory) return batch_view(at::empty({capacity}, bytes));
  auto& pool = shared.image_pool;
  for (const at::Tensor& t : pool)  // held by the pool alone: no batch or view still uses it
    if (t.use_count() == 1 && t.storage().use_count() == 1 && t.numel() == capacity)
      return batch_view(t);
  at::Tensor fresh = at::empty({capacity}, bytes);
  if (static_cast<int64_t>(pool.size()) < options.prefetch_batches + 4) pool.push_back(fresh);
  return batch_view(fresh);
}

Damage TFRecordEpoch::decode(int64_t p, const Slot& slot, Decoder& decoder, uint8_t* out,
                             int64_t* label_out) {
  if (slot.state != Slot::kReady) return slot.damage;
  const int64_t record = this->record(p);
  const auto& first = shared.first_record;
  const int file = std::upper_bound(first.begin(), first.end(), record) - first.begin() - 1;
  Damage damage{file, shared.indexes[file][record - first[file]].offset, ""};
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
        detail::concat(message, " (record_layout = ", layout_name(options.record_layout), ")");
  } else if (label - options.label_offset < 0 ||
             label - options.label_offset >= options.num_classes) {
    damage.reason = detail::concat("label ", label, " minus label_offset ", options.label_offset,
                                   " is outside [0, num_classes = ", options.num_classes, ")");
  } else if (!transform_image(
                 encoded, decoder.transform, mix_seed(epoch_seed, static_cast<uint64_t>(plan[p])),
                 out, &message,
                 want_boxes ? BoxList{decoder.boxes.data(), decoder.boxes.size()} : BoxList{})) {
    damage.reason = message;
  } else {
    *label_out = label - options.label_offset;
  }
  return damage;
}

PendingBatch& TFRecordEpoch::pending_batch(int64_t index) {
  auto [it, inserted] = batches.try_emplace(index);
  if (inserted) {
    const int64_t rows = rows_of(index);
    const auto pinned = at::TensorOptions().pinned_memory(options.pin_memory);
    it->second.images = image_buffer(rows);
    it->second.labels = at::empty({rows}, pinned.dtype(at::kLong));
    it->second.ids = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
    it->second.remaining = rows;
    it->second.bad.assign(rows, false);
  }
  return it->second;
}

void TFRecordEpoch::decode_loop() {
  const int64_t b = options.batch_size, total = static_cast<int64_t>(plan.size());
  const int64_t s = image_size;
  Decoder decoder(feature_keys(options.record_layout));  // resolved by the source: never kAuto here
  decoder.transform = options.transform;
  decoder.transform.training = options.training;
  decoder.transform.image_size = static_cast<int>(s);
  std::unique_lock<std::mutex> lock(mutex);
  try {
    while (true) {
      window_moved.wait(lock, [&] {
        return stop || next_position >= total || in_window(next_position, options.prefetch_batches);
      });
      if (stop || next_position >= total) return;
      const int64_t p = next_position++;
      const int64_t batch_index = batch_of(p), row = p - batch_index * b;
      PendingBatch& pending = pending_batch(batch_index);
      slot_ready.wait(lock, [&] { return stop || slots[p].state != Slot::kEmpty; });
      if (stop) return;
      Slot slot = std::move(slots[p]);
      slots[p] = Slot();
      uint8_t* out = pending.images.data_ptr<uint8_t>() + row * s * s * 3;
      int64_t* label_out = pending.labels.data_ptr<int64_t>() + row;
      pending.ids.data_ptr<int64_t>()[row] = record(p);
      lock.unlock();

      const Damage damage = decode(p, slot, decoder, out, label_out);
      lock.lock();
      if (slot.payload.capacity() > 0) shared.spare_payloads.push_back(std::move(slot.payload));
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

}  // namespace trainer
