#include "data/sources/tfrecord_source.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <opencv2/core/utility.hpp>

#include "base/bounded_wait.h"
#include "base/seed.h"
#include "base/storage_calls.h"
#include "base/user_error.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/record_layout.h"
#include "data/sources/epoch_plan.h"
#include "data/sources/step_shares.h"
#include "data/sources/tfrecord_epoch.h"

namespace trainer {

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
  resolve_layout();
  start_epoch(0);
}

void TFRecordSource::resolve_layout() {
  auto& o = options_;
  const bool detected = o.record_layout == RecordLayout::kAuto;
  o.record_layout = resolve_record_layout(o.record_layout, o.files, "record_layout");
  if (o.label_offset < 0) o.label_offset = default_label_offset(o.record_layout);
  if (detected && o.rank == 0)  // what was not asked for, said once per split
    spdlog::info("{} records: {} layout (from the first record), label_offset {}",
                 o.training ? "training" : "evaluation", layout_name(o.record_layout),
                 o.label_offset);
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
  return index_bad_ + bad_in_past_epochs_ + (epoch_ ? epoch_->bad_records() : 0);
}

int64_t TFRecordSource::batches_left() const { return epoch_->batches_left(); }

void TFRecordSource::stop_epoch() {
  if (!epoch_) return;
  const int blocked = epoch_->stop();
  bad_in_past_epochs_ += epoch_->bad_records();
  if (blocked == 0) {
    epoch_.reset();
    return;
  }
  const auto stuck = oldest_storage_call();
  spdlog::warn("{} input thread(s) still blocked after the epoch was stopped ({}); leaving them",
               blocked,
               stuck ? describe_stuck(*stuck, std::chrono::steady_clock::now())
                     : "a read that does not return?");
  epoch_.release();  // its threads still use it: left to the process's exit
}

void TFRecordSource::start_epoch(int64_t epoch, int64_t position) {
  stop_epoch();
  const auto& o = options_;
  EpochWork work;
  work.epoch = epoch;
  work.epoch_seed = mix_seed(o.seed, static_cast<uint64_t>(epoch));
  work.image_size = image_size_of(epoch);
  work.repetitions = o.training ? o.repetitions : 1;
  RecordTable table({});
  table.first_record = first_record_;
  PlanOptions plan{o.training,
                   o.seed,
                   o.batch_size,
                   o.shuffle_buffer,
                   o.block_records,
                   o.rank,
                   o.world_size,
                   o.epoch_order,
                   o.training ? o.repetitions : 1,
                   o.training ? o.whole_steps_of : 0};
  TORCH_INTERNAL_ASSERT(o.training || position == 0, "evaluation always starts at 0");
  work.plan = rank_plan(table, plan, epoch, position);
  const int64_t b = o.batch_size, planned = static_cast<int64_t>(work.plan.size());
  work.batch_count = o.training
                         ? steps_left(epoch_end(total_records(), position, plan.whole_steps_of),
                                      position, b * o.world_size)
                         : (planned + b - 1) / b;
  work.epoch_records = o.training ? total_records() / o.world_size : planned;
  work.chunks = chunks_of(work, table);
  epoch_ = std::make_unique<TFRecordEpoch>(
      EpochResources{options_, indexes_, first_record_, largest_image_size(), spare_payloads_,
                     image_pool_},
      std::move(work));
}

// This rank's records grouped by (file, block) into chunks, ordered by when they are first
// needed; each chunk's byte range spans only the records this rank takes from the block.
std::vector<Chunk> TFRecordSource::chunks_of(const EpochWork& work,
                                             const RecordTable& table) const {
  std::vector<Chunk> chunks;
  std::map<std::pair<int, int64_t>, size_t> chunk_of;
  for (int64_t p = 0; p < static_cast<int64_t>(work.plan.size()); ++p) {
    const int64_t record = work.record(p);
    const int file = table.file_of(record);
    const int64_t local = record - first_record_[file];
    const auto key = std::make_pair(file, local / std::max<int64_t>(1, options_.block_records));
    auto [it, inserted] = chunk_of.try_emplace(key, chunks.size());
    const IndexEntry& entry = indexes_[file][local];
    if (inserted) chunks.push_back({file, entry.offset, entry.offset + entry.size, p, {}});
    Chunk& chunk = chunks[it->second];
    chunk.begin = std::min(chunk.begin, entry.offset);
    chunk.end = std::max(chunk.end, entry.offset + entry.size);
    chunk.members.emplace_back(p, local);
  }
  return chunks;
}

Batch TFRecordSource::next_batch() { return epoch_->next_batch(); }

}  // namespace trainer
