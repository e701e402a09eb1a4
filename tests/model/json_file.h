/* A JSON fixture file parsed whole, for the model tests (CHECKs that it parses). */
#ifndef CTRL_TEST_MODEL_JSON_FILE_H
#define CTRL_TEST_MODEL_JSON_FILE_H

#include <cJSON.h>
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

#endif
