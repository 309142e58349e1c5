// One epoch of the TFRecord source (data/sources/tfrecord_source.h): this rank's plan of
// records, the reader threads that read them in chunks into slots, the decode threads that turn
// each slot into a row of its batch, and the batches waiting for the consumer. The source makes
// one per epoch and hands it what outlives the epoch (EpochResources).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/sources/batch_source.h"
#include "data/sources/epoch_plan.h"
#include "data/sources/tfrecord_source_options.h"
#include "data/transforms/augment.h"

namespace trainer {

// How long stopping an epoch waits for its threads (they end within one decode once told).
constexpr std::chrono::seconds kThreadEndTimeout{10};
// A reader whose read has not returned for this long is not waited for when the epoch stops:
// its file system does not answer (a run that ends for it ends at its deadline, not later).
constexpr std::chrono::seconds kStuckRead{1};

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

// What a decode thread keeps from record to record.
struct Decoder {
  explicit Decoder(FeatureKeys keys) : parser(keys) {}
  TransformOptions transform;  // the epoch's crop, training or evaluation
  ImageFeatureParser parser;
  std::vector<NormalisedBox> boxes;  // the record's, read for the distorted_bounding_box crop only
  std::string error;
};

// What an epoch uses of its source, which outlives it: the options and every file's index, and
// the buffers recycled from epoch to epoch, used under the epoch's mutex (Note [Recycled
// buffers] in tfrecord_epoch.cpp).
struct EpochResources {
  const TFRecordSourceOptions& options;
  const std::vector<std::vector<IndexEntry>>& indexes;  // per file
  const std::vector<int64_t>& first_record;             // (files + 1) prefix sums
  int64_t largest_image_size;                           // the run's largest crop, pixels
  std::vector<std::string>& spare_payloads;             // record buffers the decoders are done with
  std::vector<at::Tensor>& image_pool;                  // pageable batch buffers
};

// What the source decides of an epoch before it starts: the records this rank reads, the chunks
// it reads them in, and the batches they make.
struct EpochWork {
  int64_t epoch = 0;
  uint64_t epoch_seed = 0;
  int64_t image_size = 0;   // this epoch's crop, pixels (Note [Image size per epoch])
  int64_t repetitions = 1;  // copies of each record (Note [Repeated augmentation])
  // This rank's entries from the start position on: global record ids, or keys (record x
  // repetitions + copy) under repeated augmentation (Note [Repeated augmentation]).
  std::vector<int64_t> plan;
  int64_t batch_count = 0;  // batches to yield: one per step when training (the last may be empty)
  int64_t epoch_records = 0;  // this rank's share of a whole epoch, for max_bad_fraction
  std::vector<Chunk> chunks;  // in first_position order

  // The global record of plan position `p`.
  int64_t record(int64_t p) const { return record_of(plan[p], repetitions); }
};

// One epoch under way: its reader and decode threads, started when it is made, and the batches
// they fill for the consumer (the source's caller, one thread).
class TFRecordEpoch {
 public:
  TFRecordEpoch(const EpochResources& resources, EpochWork work);
  TFRecordEpoch(const TFRecordEpoch&) = delete;
  TFRecordEpoch& operator=(const TFRecordEpoch&) = delete;

  // The consumer's next batch, once its rows are decoded (bounded: options.wait_timeout).
  Batch next_batch();
  int64_t batches_left() const { return work_.batch_count - next_batch_; }
  int64_t bad_records() const;  // skipped in this epoch so far
  // Tells the threads to end and waits for them up to kThreadEndTimeout, or only until those left
  // are readers in a read of over kStuckRead. Returns 0 when all ended (and are joined); else how
  // many are still blocked (a read that does not return): the threads are then detached, and
  // this epoch, which they use, must outlive them.
  int stop();

 private:
  // The batch that plan position `p` belongs to, and a batch's rows: every batch holds
  // batch_size but the last, which holds the rest (Note [Elastic epoch order]): fewer, none, or
  // one more than batch_size.
  int64_t batch_of(int64_t p) const {
    return std::min(p / options_.batch_size, work_.batch_count - 1);
  }
  int64_t rows_of(int64_t batch) const {
    return batch < work_.batch_count - 1
               ? options_.batch_size
               : static_cast<int64_t>(work_.plan.size()) - batch * options_.batch_size;
  }
  // Whether plan position `p` may be worked on now: its batch is among the `ahead` batches from
  // the one the consumer takes next. Counted in batches, not positions, so that every row of a
  // last batch longer than batch_size is inside the window when its batch is.
  bool in_window(int64_t p, int64_t ahead) const { return batch_of(p) < next_batch_ + ahead; }
  void fail(std::exception_ptr e);  // called with `mutex_` held
  template <typename Work>
  void start_thread(Work work);
  void read_chunks(int reader);
  void reading(int reader, bool in_read);  // notes a reader's open or read begun or ended
  // Whether every thread still running is a reader in a read of over kStuckRead (`mutex_` held).
  bool only_stuck_readers_left() const;
  void decode_loop();
  // Decodes plan position `p`'s record from its payload into `out` and `label_out`, without the
  // lock; returns its damage, whose reason is empty when it decoded.
  Damage decode(int64_t p, const Slot& slot, Decoder& decoder, uint8_t* out, int64_t* label_out);
  // The batch `index`, its buffers allocated by the first of its rows to come (`mutex_` held).
  PendingBatch& pending_batch(int64_t index);
  void record_bad(const Damage& damage);  // called with `mutex_` held
  void finish_batch(int64_t index, PendingBatch& batch);
  at::Tensor image_buffer(int64_t rows);

  EpochResources shared_;
  const TFRecordSourceOptions& options_;  // shared_.options
  const EpochWork work_;
  std::vector<Slot> slots_;  // one per plan position

  mutable std::mutex mutex_;
  std::condition_variable slot_ready_, window_moved_, batch_done_, thread_ended_;
  int64_t next_batch_ = 0;     // the batch the consumer takes next (relative to the plan)
  int64_t next_position_ = 0;  // the next plan position a decode worker claims
  std::map<int64_t, PendingBatch> batches_;
  int64_t bad_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
  int running_ = 0;  // threads not yet ended
  // Per reader, when the open or read it is in began; empty while it is in none.
  std::vector<std::optional<std::chrono::steady_clock::time_point>> reading_since_;
};

template <typename Work>
void TFRecordEpoch::start_thread(Work work) {
  ++running_;
  threads_.emplace_back([this, work] {
    work();
    std::lock_guard<std::mutex> lock(mutex_);
    --running_;
    thread_ended_.notify_all();
  });
}

}  // namespace trainer
