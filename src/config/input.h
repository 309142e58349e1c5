// Checks of what `train` is given as configuration, beyond each key's own rules: the --config
// file before CLI11 reads it, and the text values after, so that every value given is the value
// the run uses and the resolved config.toml reads back as the same config.
#pragma once

#include <CLI/CLI.hpp>

namespace trainer {

// Each --config file among `argv`: its size (at most 1 MiB), and no quoted value holding '#' or
// ',', which CLI11's TOML reader takes for a comment or a list separator even inside quotes (it
// would cut or split the value without a word). Throws UserError naming the file, line and fix.
void check_config_files(int argc, const char* const argv[]);

// Each text value given is one config.toml can hold and --config read back as it is: no control
// character (a newline would end the line), no double quote (CLI11's reader takes the one inside
// quotes for their end), no backslash at the end (it escapes the closing quote) and no '#' or ','
// (as above). Throws UserError naming the key and the value.
void check_text_values(const CLI::App& app);

}  // namespace trainer
