/* The loop's metrics sinks (metrics_log.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "file_text.h"
#include "train/metrics_log.h"

static ctrl_status open_stage(train_metrics_log *m) {
    if (!(m->stage = open_memstream(&m->stage_buf, &m->stage_len)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "metrics: cannot open a memory stream: %s", strerror(errno));
    return CTRL_OK;
}

ctrl_status train_metrics_open(train_metrics_log *m, const char *out_dir, long resume_step, int tensorboard) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    if (resume_step > 0) { /* rewritten beside and renamed: a kill here loses no line */
        ctrl_status st;
        char tmp[4300], *old = ctrl_read_text_file(path, 1u << 30, &st), *save;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        for (char *line = old ? strtok_r(old, "\n", &save) : NULL; f && line;
             line = strtok_r(NULL, "\n", &save)) {
            const char *k = strstr(line, "\"step\": ");
            if (k && atol(k + 8) <= resume_step) fprintf(f, "%s\n", line);
        }
        free(old);
        if (!f || fclose(f) != 0 || rename(tmp, path) != 0)
            return ctrl_error_set(CTRL_ERR_IO, "%s: cannot rewrite it: %s", path, strerror(errno));
    }
    if (!(m->file = fopen(path, resume_step > 0 ? "a" : "w")))
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    if (tensorboard) {
        snprintf(path, sizeof path, "%s/runs", out_dir);
        ctrl_status st = ctrl_tb_open(path, &m->tb);
        if (st != CTRL_OK) return st;
    }
    return open_stage(m);
}

FILE *train_metrics_stage(train_metrics_log *m) { return m->stage; }

ctrl_status train_metrics_commit(train_metrics_log *m) {
    if (!m->stage) return CTRL_OK;
    if (fclose(m->stage) != 0) {
        m->stage = NULL;
        return ctrl_error_set(CTRL_ERR_NOMEM, "metrics: the staged lines were lost: %s", strerror(errno));
    }
    m->stage = NULL;
    ctrl_status st = CTRL_OK;
    if (m->stage_len &&
        (fwrite(m->stage_buf, 1, m->stage_len, m->file) != m->stage_len || fflush(m->file) != 0))
        st = ctrl_error_set(CTRL_ERR_IO, "metrics.jsonl: %s", strerror(errno));
    if (st == CTRL_OK && m->tb) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
        char *save = NULL;
        for (char *line = strtok_r(m->stage_buf, "\n", &save); st == CTRL_OK && line;
             line = strtok_r(NULL, "\n", &save))
            st = ctrl_tb_metrics_line(m->tb, t, line);
    }
    free(m->stage_buf);
    m->stage_buf = NULL, m->stage_len = 0;
    ctrl_status st2 = open_stage(m);
    return st != CTRL_OK ? st : st2;
}

void train_metrics_close(train_metrics_log *m) {
    if (m->stage) fclose(m->stage);
    free(m->stage_buf);
    if (m->file) fclose(m->file);
    ctrl_tb_close(m->tb);
    *m = (train_metrics_log){0};
}
