/* Parquet files read row by row as JSON objects (what the dataset loaders take from JSONL), written
 * from the Apache Parquet format specification with no Arrow dependency: the thrift-compact footer,
 * row groups read one at a time, data pages v1 and v2, PLAIN, dictionary (RLE / bit-packed hybrid
 * levels and indices), DELTA_* and BYTE_STREAM_SPLIT encodings, nullable columns (definition
 * levels), lists, maps and nested structs (repetition levels: a chat `messages` column,
 * list<struct<role, content>>, arrives as an array of objects), UNCOMPRESSED, SNAPPY, GZIP and ZSTD
 * pages. The file is untrusted: every offset and length is checked, and an error names the file,
 * the row group and the column. */
#ifndef CTRL_DATASET_PARQUET_H
#define CTRL_DATASET_PARQUET_H

#include <cJSON.h>
#include <stdint.h>

#include <ctrl/status.h>

typedef struct ctrl_parquet ctrl_parquet;

/* Opens and checks the footer and schema (no page is read yet). */
ctrl_status ctrl_parquet_open(const char *path, ctrl_parquet **out);
/* The row count the footer declares. */
int64_t ctrl_parquet_num_rows(const ctrl_parquet *p);
/* The next row as a JSON object (the caller deletes it): 1, 0 at the end, or -1 with the message
 * set. Strings are STRING/UTF8 columns (and unannotated BYTE_ARRAY), numbers the integer and
 * floating-point columns, booleans, null for a null value; lists are arrays and structs objects. */
int ctrl_parquet_next(ctrl_parquet *p, cJSON **row);
void ctrl_parquet_close(ctrl_parquet *p);

/* 1 when the `n` bytes start with parquet's magic "PAR1". */
int ctrl_parquet_magic(const void *head, size_t n);

#endif
