// One epoch of the TFRecord source (data/sources/tfrecord_source.h): this rank's plan of
// records, the reader threads that read them in chunks into slots, the decode threads that turn
// each slot into a row of its batch, and the batches waiting for the consumer. The source makes
// one per epoch and hands it what outlives the epoch (EpochResources).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/sources/tfrecord_source_options.h"
#include "data/transforms/augment.h"

namespace trainer {

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

struct TFRecordEpoch {
  EpochResources shared;
  const TFRecordSourceOptions& options;  // shared.options
  int64_t epoch = 0;
  uint64_t epoch_seed = 0;
  int64_t image_size = 0;   // this epoch's crop, pixels (Note [Image size per epoch])
  int64_t repetitions = 1;  // copies of each record (Note [Repeated augmentation])
  // This rank's entries from the start position on: global record ids, or keys (record x
  // repetitions + copy) under repeated augmentation (Note [Repeated augmentation]).
  std::vector<int64_t> plan;
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

  explicit TFRecordEpoch(const EpochResources& resources)
      : shared(resources), options(resources.options) {}

  // The batch that plan position `p` belongs to, and a batch's rows: every batch holds
  // batch_size but the last, which holds the rest (Note [Elastic epoch order]): fewer, none, or
  // one more than batch_size.
  int64_t record(int64_t p) const { return record_of(plan[p], repetitions); }
  int64_t batch_of(int64_t p) const { return std::min(p / options.batch_size, batch_count - 1); }
  int64_t rows_of(int64_t batch) const {
    return batch < batch_count - 1 ? options.batch_size
                                   : static_cast<int64_t>(plan.size()) - batch * options.batch_size;
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
  // Decodes plan position `p`'s record from its payload into `out` and `label_out`, without the
  // lock; returns its damage, whose reason is empty when it decoded.
  Damage decode(int64_t p, const Slot& slot, Decoder& decoder, uint8_t* out, int64_t* label_out);
  // The batch `index`, its buffers allocated by the first of its rows to come (`mutex` held).
  PendingBatch& pending_batch(int64_t index);
  void record_bad(const Damage& damage);  // called with `mutex` held
  void finish_batch(int64_t index, PendingBatch& batch);
  at::Tensor image_buffer(int64_t rows);
};

template <typename Work>
void TFRecordEpoch::start_thread(Work work) {
  ++running;
  threads.emplace_back([this, work] {
    work();
    std::lock_guard<std::mutex> lock(mutex);
    --running;
    thread_ended.notify_all();
  });
}

}  // namespace trainer
