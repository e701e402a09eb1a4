/* Snappy decompression (the raw block format parquet's SNAPPY codec stores), of untrusted input. */
#ifndef CTRL_DATASET_SNAPPY_H
#define CTRL_DATASET_SNAPPY_H

#include <stddef.h>
#include <stdint.h>

/* Decompresses `src` into exactly `cap` bytes at `dst`. Returns NULL on success, else what is wrong
 * (a copy before the start, a length that does not match `cap`, truncated input...). */
const char *ctrl_snappy_decompress(const uint8_t *src, size_t n, uint8_t *dst, size_t cap);

#endif
