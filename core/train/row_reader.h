/* Dataset rows, streamed: a .jsonl file one object per line, a .json file holding one array of
 * objects (read element by element so that a multi-GB file is never held whole), a parquet file
 * (one row group at a time) or an Arrow IPC stream (`datasets`' save_to_disk; one record batch at a
 * time); or every data file of one split of a folder or a Hub dataset id
 * (core/dataset/dataset_files.h), one after another. */
#ifndef CTRL_CORE_ROW_READER_H
#define CTRL_CORE_ROW_READER_H

#include <cJSON.h>
#include <stdio.h>

#include <ctrl/option.h>
#include <ctrl/status.h>

typedef struct ctrl_row_reader ctrl_row_reader;

ctrl_status ctrl_row_reader_open(const char *path, ctrl_row_reader **out); /* the train split */
ctrl_status ctrl_row_reader_open_split(const char *path, const char *split, ctrl_row_reader **out);
/* `path` as a run's data: the split is [data] eval_split when `path` is the settings' eval_file
 * (the same pointer), else [data] split; within [data] subset when set. */
ctrl_status ctrl_row_reader_open_data(const char *path, const ctrl_config *cfg, ctrl_row_reader **out);
/* The file the last row came from (a folder's rows come from several); for a parquet or Arrow
 * file the row's "line" is its 1-based row number. */
const char *ctrl_row_reader_file(const ctrl_row_reader *r);
/* The next row: *row is the parsed value (NULL when the row is not valid JSON; the caller reports
 * or skips it), *line its first line in the file. Returns 0 at the end, 1 for a row, -1 on an
 * error that stops reading (an unterminated array: message set). */
int ctrl_row_reader_next(ctrl_row_reader *r, cJSON **row, long *line);
void ctrl_row_reader_close(ctrl_row_reader *r);

#endif
