/* A data file mapped read-only into memory (the parquet and Arrow readers work on its bytes). */
#ifndef CTRL_DATASET_MAPPED_FILE_H
#define CTRL_DATASET_MAPPED_FILE_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

/* Maps `path`; a file shorter than `min` bytes is CTRL_ERR_FORMAT, "not {what}". */
ctrl_status ctrl_mapped_file_open(const char *path, size_t min, const char *what, const uint8_t **data,
                                  size_t *size);
void ctrl_mapped_file_close(const uint8_t *data, size_t size);

#endif
