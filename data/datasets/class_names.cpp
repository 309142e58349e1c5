#include "data/datasets/class_names.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/storage_calls.h"
#include "base/user_error.h"

namespace trainer {

std::vector<ClassName> read_class_names(const std::string& path) {
  const StorageCallScope call("reading", path);
  std::ifstream in(path);
  USER_CHECK(in, "cannot read the class names file '", path, "'");
  std::vector<ClassName> classes;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // written on Windows
    const size_t begin = line.find_first_not_of(" \t");
    USER_CHECK(begin != std::string::npos, path, ":", number,
               ": empty line; expected one class per line, 'WNID[ words]' (line 1 is class 0)");
    const size_t end = line.find_first_of(" \t", begin);
    ClassName c{line.substr(begin, end - begin), ""};
    if (end != std::string::npos) {
      const size_t words = line.find_first_not_of(" \t", end);
      if (words != std::string::npos) c.text = line.substr(words);
    }
    classes.push_back(std::move(c));
  }
  USER_CHECK(!classes.empty(), "the class names file '", path, "' is empty");
  return classes;
}

void write_class_names(const std::string& path, const std::vector<ClassName>& classes) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    for (const auto& c : classes) out << c.synset << (c.text.empty() ? "" : " ") << c.text << "\n";
    out.close();
    USER_CHECK(out, "cannot write '", temporary, "'");
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace trainer
