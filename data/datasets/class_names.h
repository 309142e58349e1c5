// The names of a dataset's classes, in label order: the file that carries them beside the
// records (`synsets.txt`, written by make-tfrecords and index-tfrecords) and its readers.
//
// One class per line, line 1 being the class trained as index 0 (stored label label_offset):
// the WordNet ID, then optionally whitespace and the class's words,
//
//   n01440764 tench, Tinca tinca
//
// the format of Kaggle's LOC_synset_mapping.txt and, without the words, of TensorFlow Datasets'
// label.labels.txt, so either file serves as it is.
#pragma once

#include <string>
#include <vector>

namespace trainer {

struct ClassName {
  std::string synset;  // WordNet ID, e.g. n02099601
  std::string text;    // its words, e.g. "golden retriever"; may be empty
};

// The file's classes; UserError naming the file and line when a line is empty or unreadable.
std::vector<ClassName> read_class_names(const std::string& path);
// Writes `classes` to `path` atomically (a temporary file renamed into place).
void write_class_names(const std::string& path, const std::vector<ClassName>& classes);

// The file name make-tfrecords and index-tfrecords write beside the records.
inline constexpr const char* kClassNamesFile = "synsets.txt";

}  // namespace trainer
