/* Dataset rows, streamed: a .jsonl file one object per line, or a .json file holding one array of
 * objects, read element by element so that a multi-GB file is never held whole. */
#ifndef CTRL_CORE_ROW_READER_H
#define CTRL_CORE_ROW_READER_H

#include <cJSON.h>
#include <stdio.h>

#include <ctrl/status.h>

typedef struct ctrl_row_reader ctrl_row_reader;

ctrl_status ctrl_row_reader_open(const char *path, ctrl_row_reader **out);
/* The next row: *row is the parsed value (NULL when the row is not valid JSON; the caller reports
 * or skips it), *line its first line in the file. Returns 0 at the end, 1 for a row, -1 on an
 * error that stops reading (an unterminated array: message set). */
int ctrl_row_reader_next(ctrl_row_reader *r, cJSON **row, long *line);
void ctrl_row_reader_close(ctrl_row_reader *r);

#endif
