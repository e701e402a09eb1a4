/* Reading untrusted text and JSON files (core/file_text.c): every failure is a status naming the
 * file, never a crash -- a missing file, one over the size bound, invalid JSON, a JSON value that is
 * not an object -- and an object comes back whole. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_text.h"
#include "test.h"

/* `text` in a fresh file of `dir`; its path in `path`. */
static void write_file(const char *dir, const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) fputs(text, f), fclose(f);
}

/* ctrl_read_json_object on `text` fails with `code` and a message holding the path and `msg`. */
static void expect_refused(const char *dir, const char *name, const char *text, size_t max, ctrl_status code,
                           const char *msg) {
    char path[512];
    write_file(dir, name, text, path, sizeof path);
    ctrl_status st = CTRL_OK;
    struct cJSON *o = ctrl_read_json_object(path, max, &st);
    CHECK_MSG(o == NULL && st == code, "%s: status %d", name, (int)st);
    CHECK_CONTAINS(ctrl_error_message(), path);
    CHECK_CONTAINS(ctrl_error_message(), msg);
    cJSON_Delete(o);
    remove(path);
}

TEST(json_object_read_or_refused_naming_the_file) {
    char dir[] = "/tmp/ctrl_file_text_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    write_file(dir, "config.json", "{\"hidden_size\": 64, \"name\": \"x\"}", path, sizeof path);
    ctrl_status st = CTRL_ERR_RUNTIME;
    struct cJSON *o = ctrl_read_json_object(path, 1 << 10, &st);
    CHECK(o != NULL && st == CTRL_OK);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "hidden_size");
    CHECK(cJSON_IsNumber(h) && h->valueint == 64);
    cJSON_Delete(o);
    remove(path);

    expect_refused(dir, "array.json", "[1, 2]", 1 << 10, CTRL_ERR_FORMAT, "not a JSON object");
    expect_refused(dir, "truncated.json", "{\"a\": [1, 2", 1 << 10, CTRL_ERR_FORMAT, "not a JSON object");
    expect_refused(dir, "empty.json", "", 1 << 10, CTRL_ERR_FORMAT, "not a JSON object");
    expect_refused(dir, "large.json", "{\"a\": \"0123456789\"}", 8, CTRL_ERR_FORMAT, "file too large");

    snprintf(path, sizeof path, "%s/missing.json", dir);
    st = CTRL_OK;
    CHECK(ctrl_read_json_object(path, 1 << 10, &st) == NULL && st == CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), path);
    rmdir(dir);
}
