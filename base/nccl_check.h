// NCCL calls checked: a failure throws with file:line, the call, NCCL's message and its last error.
#pragma once

#include <nccl.h>

#include <stdexcept>

#include "base/user_error.h"

#define NCCL_CHECK(expr)                                                                           \
  do {                                                                                             \
    ncclResult_t status_ = (expr);                                                                 \
    if (status_ != ncclSuccess)                                                                    \
      throw std::runtime_error(::trainer::detail::concat(__FILE__, ":", __LINE__, ": ", #expr,     \
                                                         " failed: ", ncclGetErrorString(status_), \
                                                         " (", ncclGetLastError(nullptr), ")"));   \
  } while (0)
