// The names of the run's classes: the file class_names_file names, else the class names file
// beside the data (synsets.txt, else TFDS's label.labels.txt), checked against num_classes. They
// go into checkpoints and are checked against the checkpoints a run starts from or evaluates.
#pragma once

#include "src/config/config.h"
#include "src/state/class_match.h"

namespace trainer {

// File names looked for beside the records, in this order.
inline constexpr const char* kClassNamesFiles[] = {kClassNamesFile, "label.labels.txt"};

// The run's class names; empty names when there are none (logged, with how to get them). A
// class_names_file that cannot be read, or a file whose count of names is not num_classes, is a
// UserError.
NamedClasses find_data_classes(const Config& config);

}  // namespace trainer
