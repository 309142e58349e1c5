// CRC32C (Castagnoli), as TFRecord framing uses it, and TensorFlow's masking of stored CRCs.
// Uses the SSE4.2 crc32 instruction where the CPU has it, else a slicing-by-8 table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainer {

// CRC32C of `size` bytes, continuing from `crc` (0 for a fresh checksum).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// TensorFlow stores CRCs rotated and offset ("masked") so that CRCs of CRCs stay well-distributed.
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace trainer
