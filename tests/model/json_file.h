/* A JSON fixture file parsed whole, for the model tests (CHECKs that it parses), and its integer
 * arrays. */
#ifndef CTRL_TEST_MODEL_JSON_FILE_H
#define CTRL_TEST_MODEL_JSON_FILE_H

#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>

#include "file_text.h"
#include "test.h"

static inline cJSON *json_file(const char *path) {
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(root != NULL, "%s: %s", path, ctrl_error_message());
    return root;
}

/* root[key] as int32 values (calloc'ed, at least one element; the caller frees it), their number in
 * *n (0 where the key is missing). */
static inline int32_t *json_ints(const cJSON *root, const char *key, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    *n = cJSON_GetArraySize(a);
    int32_t *out = calloc((size_t)(*n ? *n : 1), sizeof(int32_t));
    int i = 0;
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next) out[i++] = (int32_t)e->valuedouble;
    return out;
}

#endif
