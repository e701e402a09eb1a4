#include "file_text.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ctrl_read_text_file(const char *path, size_t max, ctrl_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || (size_t)n > max) {
        fclose(f);
        *st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: file too large (at most %zu bytes)", path, max);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf) {
        *st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    buf[got] = '\0';
    *st = CTRL_OK;
    return buf;
}

cJSON *ctrl_read_json_object(const char *path, size_t max, ctrl_status *st) {
    char *text = ctrl_read_text_file(path, max, st);
    if (!text) return NULL;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        *st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    return root;
}
