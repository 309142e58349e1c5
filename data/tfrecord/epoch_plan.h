// Which records a rank reads in an epoch, and in what order. See Note [Equal steps on all ranks].
// The plan depends only on (record counts per file, seed, epoch, rank, world size): no I/O, no
// communication, so every rank computes its part of the same global order independently.
#pragma once

#include <cstdint>
#include <vector>

namespace trainer {

// Note [Equal steps on all ranks]
// Training: the epoch's global order is built from the seed and the epoch alone: files shuffled,
// each file cut into blocks of contiguous records whose order is shuffled within the file,
// records shuffled within their block, then a shuffle buffer mixes neighbouring blocks. Rank r
// takes the contiguous slice [r * n, (r + 1) * n) with n = floor(total / (world * batch)) * batch,
// so every rank yields exactly n / batch full batches and the remainder (different images each
// epoch) is dropped on all ranks alike. Contiguous slices keep each rank's reads in few files, in
// multi-MB blocks. Evaluation: the records in file order, cut into `world` contiguous slices whose
// sizes differ by at most one; each record is seen exactly once across ranks, nothing is padded,
// and the last batch is short.

struct PlanOptions {
  bool training = true;
  uint64_t seed = 0;           // shared by all ranks
  int64_t batch_size = 1;      // per rank
  int64_t shuffle_buffer = 0;  // records; 0 or 1: no buffer
  int64_t block_records = 64;  // records per read block (shuffled as a unit between files)
  int rank = 0;
  int world_size = 1;
};

// Global record ids: file f's record i is first_record[f] + i (files in listing order).
struct RecordTable {
  std::vector<int64_t> first_record;  // (F + 1) prefix sums of records per file
  explicit RecordTable(const std::vector<int64_t>& records_per_file);
  int64_t total() const { return first_record.back(); }
  int file_of(int64_t record) const;  // binary search
};

// Samples per rank per epoch: the same on every rank for training (a multiple of batch_size).
int64_t samples_per_rank(const RecordTable& table, const PlanOptions& options);

// The whole epoch's order of global record ids (training: shuffled; evaluation: identity).
std::vector<int64_t> global_order(const RecordTable& table, const PlanOptions& options,
                                  int64_t epoch);

// This rank's records of `epoch`, in the order they are yielded.
std::vector<int64_t> rank_plan(const RecordTable& table, const PlanOptions& options, int64_t epoch);

// 64-bit mixing (splitmix64): seeds derived from (seed, epoch, record) are unrelated streams.
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace trainer
