// What this process has spent so far, read from /proc/self: for the start-up figures that rank 0
// logs after the first step (how long from launch, how much data read to get there).
#pragma once

#include <cstdint>

namespace trainer {

// Seconds since the kernel started this process (dynamic loading and static initialisers
// included); 0 when /proc is not readable.
double seconds_since_process_start();

// Bytes this process has read through read(2)-family calls (rchar: data files, indexes and
// configuration, whether or not they came from the page cache); 0 when /proc is not readable.
int64_t bytes_read_by_process();

// Bytes this process had fetched from storage (read_bytes: page-cache hits not counted); 0 when
// /proc is not readable.
int64_t bytes_read_from_storage();

}  // namespace trainer
