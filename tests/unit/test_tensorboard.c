/* TensorBoard event files (core/train/tensorboard.c) against files the tensorboard package wrote
 * itself for the same events (tests/reference/make_tensorboard_fixtures.py): byte for byte, the
 * TFRecord framing and masked CRC32C included; the metrics-line conversion against the tags the HF
 * Trainer's TensorBoard callback gives. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_text.h"
#include "test.h"
#include "train/tensorboard.h"

static char *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)*n + 1);
    if (p && fread(p, 1, (size_t)*n, f) != (size_t)*n) *n = -1;
    fclose(f);
    return p;
}

/* The written file equals the reference file. */
static void check_same(const char *mine, const char *name) {
    char ref[4096];
    snprintf(ref, sizeof ref, "%s/tensorboard/%s", CTRL_FIXTURE_DIR, name);
    long a = 0, b = 0;
    char *x = read_all(mine, &a), *y = read_all(ref, &b);
    CHECK_MSG(x && y && a == b && a > 0 && !memcmp(x, y, (size_t)a),
              "%s: %ld bytes written, the reference %ld", name, a, b);
    free(x), free(y);
}

TEST(crc32c_check_value) {
    CHECK_EQ_INT(ctrl_crc32c("123456789", 9), 0xE3069283u); /* the CRC-32C check value */
    CHECK_EQ_INT(ctrl_crc32c("", 0), 0);
}

TEST(events_match_the_tensorboard_package) {
    char path[4096];
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/tensorboard/events.json", 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL);
    if (!root) return;
    snprintf(path, sizeof path, "/tmp/ctrl_test_tb_%d.bin", (int)getpid());
    ctrl_tb_writer *w = NULL;
    CHECK_EQ_INT(ctrl_tb_open_file(path, cJSON_GetObjectItem(root, "first_wall_time")->valuedouble, &w),
                 CTRL_OK);
    const cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(root, "events")) {
        const cJSON *tags = cJSON_GetObjectItem(ev, "tags"), *vals = cJSON_GetObjectItem(ev, "values");
        const int n = cJSON_GetArraySize(tags);
        const char *t[8];
        float v[8];
        for (int i = 0; i < n && i < 8; i++)
            t[i] = cJSON_GetArrayItem(tags, i)->valuestring,
            v[i] = (float)cJSON_GetArrayItem(vals, i)->valuedouble;
        CHECK_EQ_INT(ctrl_tb_scalars(w, cJSON_GetObjectItem(ev, "wall_time")->valuedouble,
                                     (int64_t)cJSON_GetObjectItem(ev, "step")->valuedouble, t, v, n),
                     CTRL_OK);
    }
    CHECK_EQ_INT(ctrl_tb_close(w), CTRL_OK);
    check_same(path, "events.bin");
    /* a metrics.jsonl line: its numbers but step, tagged as the HF Trainer tags them */
    const double t0 = cJSON_GetObjectItem(root, "first_wall_time")->valuedouble;
    CHECK_EQ_INT(ctrl_tb_open_file(path, t0, &w), CTRL_OK);
    CHECK_EQ_INT(ctrl_tb_metrics_line(w, t0, cJSON_GetObjectItem(root, "metrics_line")->valuestring),
                 CTRL_OK);
    CHECK_EQ_INT(ctrl_tb_metrics_line(w, t0, "{\"no_step\": 1}"), CTRL_OK); /* not a step's line: nothing */
    CHECK_EQ_INT(ctrl_tb_close(w), CTRL_OK);
    check_same(path, "metrics_line.bin");
    unlink(path);
    cJSON_Delete(root);
    free(text);
}

TEST(unwritable_directory_is_a_clear_error) {
    ctrl_tb_writer *w = NULL;
    CHECK_EQ_INT(ctrl_tb_open("/proc/ctrl-no-such-dir/runs", &w), CTRL_ERR_IO);
    CHECK(w == NULL && strstr(ctrl_error_message(), "TensorBoard directory") != NULL);
}
