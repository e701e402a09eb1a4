/* Reading a whole (untrusted) text file, bounded in size; a JSON file's object. */
#ifndef CTRL_CORE_FILE_TEXT_H
#define CTRL_CORE_FILE_TEXT_H

#include <stddef.h>

#include <ctrl/status.h>

/* The NUL-terminated contents of `path` (malloc'd), or NULL with *st set: CTRL_ERR_IO when it
 * cannot be opened, CTRL_ERR_FORMAT when larger than `max` bytes. */
char *ctrl_read_text_file(const char *path, size_t max, ctrl_status *st);

struct cJSON;
/* The JSON object `path` holds (cJSON_Delete it), or NULL with *st set: ctrl_read_text_file's
 * errors, or CTRL_ERR_FORMAT "PATH: not a JSON object" (invalid JSON, or another value). */
struct cJSON *ctrl_read_json_object(const char *path, size_t max, ctrl_status *st);

#endif
