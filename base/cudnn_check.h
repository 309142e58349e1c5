// cuDNN calls checked, the legacy API's and cudnn-frontend's alike: a failure throws with
// file:line, the call and cuDNN's message. Whether cuDNN runs a fusion on this card at all is
// decided once, when the fusion is probed (models/cuda/fused_batch_norm.h, conv_bn_graphs.h), where
// the log names the key that turns it off; a failure here, after the probe, is the library's.
#pragma once

#include <cudnn.h>

#include <stdexcept>

#include "base/user_error.h"

#define CUDNN_CHECK(expr)                                                                    \
  do {                                                                                       \
    const cudnnStatus_t status_ = (expr);                                                    \
    if (status_ != CUDNN_STATUS_SUCCESS)                                                     \
      throw std::runtime_error(::trainer::detail::concat(                                    \
          __FILE__, ":", __LINE__, ": ", #expr, " failed: ", cudnnGetErrorString(status_))); \
  } while (0)

// For cudnn-frontend's cudnn_frontend::error_t (is_good(), get_message(), which is not const).
#define CUDNN_FE_CHECK(expr)                                                                   \
  do {                                                                                         \
    auto status_ = (expr);                                                                     \
    if (!status_.is_good())                                                                    \
      throw std::runtime_error(::trainer::detail::concat(__FILE__, ":", __LINE__, ": ", #expr, \
                                                         " failed: ", status_.get_message())); \
  } while (0)
