// The record layout of a dataset (RecordLayout, data/formats/tfrecord/image_example.h): the one
// asked for, or the one detected from the first record of its first file. Read by the TFRecord
// source for each split and by the data tools, so that all of them decide the same way.
#pragma once

#include <string>
#include <vector>

#include "data/formats/tfrecord/image_example.h"

namespace trainer {

// `requested` unless it is kAuto; then the layout of the first intact record of `files` (empty
// files and a few damaged records stepped over): one record read when the data is sound, and the
// same one on every rank, which all list the same files in the same (sorted) order, so every rank
// decides alone and alike. UserError naming that record's file, the features it holds, the two
// layouts and `key` (what to set to choose one) when neither layout matches, or naming the damage
// when no intact record comes first.
RecordLayout resolve_record_layout(RecordLayout requested, const std::vector<std::string>& files,
                                   const std::string& key);

}  // namespace trainer
