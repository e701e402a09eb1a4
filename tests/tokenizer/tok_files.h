/* Tokenizer tests' hand-written files: write one into the test's scratch directory, and expect
 * loading it to fail with a status and a message naming the file and containing `needle`. */
#ifndef CTRL_TESTS_TOK_FILES_H
#define CTRL_TESTS_TOK_FILES_H

#include <stdio.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

static inline const char *tok_write_file(const char *name, const char *text) {
    static char path[1024];
    const char *dir = test_tmp_dir();
    if (!dir) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static inline void tok_expect_load_error(const char *name, const char *json, ctrl_status status,
                                         const char *needle) {
    const char *path = tok_write_file(name, json);
    ctrl_tokenizer *t = NULL;
    ctrl_status st = ctrl_tokenizer_load(path, &t);
    CHECK_MSG(st == status, "%s: %s (%s)", name, ctrl_status_name(st), ctrl_error_message());
    CHECK(t == NULL);
    CHECK_CONTAINS(ctrl_error_message(), name);
    CHECK_CONTAINS(ctrl_error_message(), needle);
    ctrl_tokenizer_free(t);
}

#endif
