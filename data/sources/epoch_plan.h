// Which records a rank reads in an epoch, and in what order. See Note [Equal steps on all ranks].
// The plan depends only on (record counts per file, seed, epoch, position, rank, world size): no
// I/O, no communication, so every rank computes its part of the same global order independently.
#pragma once

#include <cstdint>
#include <vector>

namespace trainer {

// Note [Equal steps on all ranks]
// Training: the epoch's global order is built from the seed and the epoch alone: files shuffled,
// each file cut into blocks of contiguous records whose order is shuffled within the file,
// records shuffled within their block, then a shuffle buffer mixes neighbouring blocks. Each step
// takes the next global batch of that order and deals it to the ranks (Note [Elastic epoch order]
// in data/sources/step_shares.h), so every rank runs the same number of steps, the epoch's last
// step is short rather than dropping records (unless drop_last), and a rank's share of a step is
// a few runs of contiguous records, read in multi-MB blocks. Evaluation: the records in file
// order, cut into `world` contiguous slices whose sizes differ by at most one; each record is
// seen exactly once across ranks, nothing is padded, and the last batch is short.

// The order of a training epoch's records: global, or by node (Note [Records by node]).
enum class EpochOrder { kGlobal, kByNode };

// Note [Records by node]
// epoch_order = by_node keeps the records each node reads the same every epoch, so that after the
// first epoch the node's page cache serves them instead of the shared file system. The records are
// cut into kNodeGroups groups of consecutive global ids (sizes differing by at most one), the same
// every epoch. Each group is read in its own order of the epoch (its pieces, the file blocks of
// block_records it holds, shuffled; records shuffled within each piece), and the epoch's global
// order takes one record from every group in turn, the groups in bit-reversed order. Every step so
// holds nearly the same number of records of every group, and its deal by sorted id (Note [Elastic
// epoch order]) gives rank r about the ids [r/W, (r+1)/W) of the whole table in every step of every
// epoch: a node of consecutive ranks reads a fixed 1/N of the data. Where N does not divide
// kNodeGroups, a group on a node boundary is split between the two nodes anew each epoch (at most
// N/kNodeGroups more reading per node). The order is still a function of the seed and the epoch
// alone, so a resume at any world size stays exact; it mixes many groups in every step instead of a
// shuffle buffer. Each rank holds the pieces it is reading: about kNodeGroups / W of them (60
// pieces, ~400 MB of ImageNet, at 8 ranks; 3 at 160).

// Note [Repeated augmentation]
// repetitions = k > 1 (torchvision's RASampler, --ra-sampler --ra-reps k): the epoch keeps its
// length, but its order shows the first 1/k of the records of the order above, each k times in a
// row: position j holds copy j % k of the (j / k)-th record. An entry of the order is then a key,
// record x k + copy, so that the copies are distinct samples: each is read and augmented on its
// own (the decode seed mixes in the key). A full step, sorted by key, holds each record's k copies
// side by side; its deal sends them to k consecutive ranks, as RASampler does
// (indices[rank::num_replicas] of the repeated list): within each run of k ranks, rank c takes
// copy c of the run's records (when k divides the world size; else copies may share a rank). The
// order is still a function of the seed and the epoch: exact under resume at any world size.
// RASampler also rounds the epoch down to a multiple of 256 images; here it keeps every position.
// 2^5 x 3 x 5: divides every node count up to 6, and 8, 10, 12, 15, 16, 20, 24, 30, 32, 40, ...
constexpr int64_t kNodeGroups = 480;

struct PlanOptions {
  bool training = true;
  uint64_t seed = 0;           // shared by all ranks
  int64_t batch_size = 1;      // per rank
  int64_t shuffle_buffer = 0;  // records; 0 or 1: no buffer
  int64_t block_records = 64;  // records per read block (shuffled as a unit between files)
  int rank = 0;
  int world_size = 1;
  EpochOrder order = EpochOrder::kGlobal;  // training: Note [Records by node]
  int64_t repetitions = 1;  // training: copies of each record shown (Note [Repeated augmentation])
  // Training, drop_last: the epoch ends at its last whole step of this many records (Note [The
  // last partial step] in data/sources/step_shares.h); 0: its last step takes what is left.
  int64_t whole_steps_of = 0;
};

// The record an entry of an order holds, and which of its copies it is.
inline int64_t record_of(int64_t key, int64_t repetitions) { return key / repetitions; }

// Global record ids: file f's record i is first_record[f] + i (files in listing order).
struct RecordTable {
  std::vector<int64_t> first_record;  // (F + 1) prefix sums of records per file
  explicit RecordTable(const std::vector<int64_t>& records_per_file);
  int64_t total() const { return first_record.back(); }
  int file_of(int64_t record) const;  // binary search
};

// The whole epoch's order of global record ids (training: shuffled, by the options' order;
// evaluation: identity).
std::vector<int64_t> global_order(const RecordTable& table, const PlanOptions& options,
                                  int64_t epoch);

// This rank's entries (records, or keys under repetitions) of `epoch` from global position
// `position` on (training; evaluation always starts at 0), in the order they are yielded.
std::vector<int64_t> rank_plan(const RecordTable& table, const PlanOptions& options, int64_t epoch,
                               int64_t position = 0);

}  // namespace trainer
