/* Arrow IPC streams read row by row as JSON objects: the .arrow files of a `datasets` save_to_disk
 * folder (the IPC streaming format: encapsulated messages, a Schema then RecordBatches, their
 * metadata flatbuffers), written from the Arrow columnar format specification with no Arrow
 * dependency. Types: null, booleans, integers, floats (half, single, double), (large) strings and
 * binaries, fixed-size binaries, (large, fixed-size) lists, structs and maps; uncompressed or ZSTD
 * buffers. The file is untrusted: every offset and length is checked, and an error names the file,
 * the batch and the column. */
#ifndef CTRL_DATASET_ARROW_IPC_H
#define CTRL_DATASET_ARROW_IPC_H

#include <cJSON.h>
#include <stddef.h>

#include <ctrl/status.h>

typedef struct ctrl_arrow ctrl_arrow;

/* Opens the stream and reads its schema. */
ctrl_status ctrl_arrow_open(const char *path, ctrl_arrow **out);
/* The next row as a JSON object (the caller deletes it): 1, 0 at the end, or -1 with the message
 * set. Values map as the parquet reader's do (dataset/parquet.h). */
int ctrl_arrow_next(ctrl_arrow *a, cJSON **row);
void ctrl_arrow_close(ctrl_arrow *a);

/* 1 when the `n` bytes start an Arrow IPC stream (a continuation marker) or file ("ARROW1"). */
int ctrl_arrow_magic(const void *head, size_t n);

#endif
