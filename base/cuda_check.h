// CUDA runtime calls checked: a failure throws with file:line, the call and CUDA's message (a
// library failure, exit status 1; see user_error.h for errors the user can fix).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "base/user_error.h"

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t status_ = (expr);                                                           \
    if (status_ != cudaSuccess)                                                             \
      throw std::runtime_error(::trainer::detail::concat(                                   \
          __FILE__, ":", __LINE__, ": ", #expr, " failed: ", cudaGetErrorString(status_))); \
  } while (0)
