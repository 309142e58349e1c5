// The shared `main` wrapper of the data tools: runs the tool body, turns UserError and other
// exceptions into one message on stderr and exit code 2 (1 is left for "the data is damaged").
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "base/user_error.h"

namespace trainer {

template <typename Body>
int run_tool(CLI::App& app, int argc, char** argv, Body body) {
  try {
    app.parse(argc, argv);
    return body();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const UserError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": internal error: " << e.what() << "\n";
    return 3;
  }
}

}  // namespace trainer
