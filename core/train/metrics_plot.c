/* metrics.jsonl -> a whitespace-separated table -> gnuplot (pngcairo, or png where cairo is absent). */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "file_text.h"
#include "train/metrics_plot.h"

static const char *const columns[] = {"step",    "loss",  "grad_norm", "learning_rate", "mean_token_accuracy",
                                      "entropy", "reward"};
enum {
    N_COLUMNS = 7,
    COL_LOSS = 1,
    COL_GRAD_NORM = 2,
    COL_LR = 3,
    COL_ACCURACY = 4,
    COL_ENTROPY = 5,
    COL_REWARD = 6
};

/* The table gnuplot reads: one row per logged step; a missing metric is "?" (gnuplot skips it). */
static ctrl_status write_table(const char *jsonl, const char *table, int *rows, int *have) {
    ctrl_status st;
    char *text = ctrl_read_text_file(jsonl, 1u << 30, &st);
    if (!text) return st;
    FILE *f = fopen(table, "w");
    if (!f) {
        free(text);
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", table, strerror(errno));
    }
    *rows = 0;
    char *save;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        if (o && cJSON_IsNumber(cJSON_GetObjectItem(o, "step"))) {
            for (int c = 0; c < N_COLUMNS; c++) {
                const cJSON *v = cJSON_GetObjectItem(o, columns[c]);
                if (cJSON_IsNumber(v))
                    fprintf(f, "%.9g ", v->valuedouble), have[c] = 1;
                else
                    fputs("? ", f);
            }
            fputc('\n', f);
            (*rows)++;
        }
        cJSON_Delete(o);
    }
    free(text);
    if (fclose(f) != 0) return ctrl_error_set(CTRL_ERR_IO, "%s: write failed", table);
    return CTRL_OK;
}

static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *copy = strdup(path), *save;
    if (!copy) return 0;
    int found = 0;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/gnuplot", dir);
        found = access(p, X_OK) == 0;
    }
    free(copy);
    return found;
}

ctrl_status ctrl_metrics_plot(const char *metrics_jsonl, const char *png) {
    if (!have_gnuplot())
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "no plot: gnuplot is not installed (apt-get install gnuplot-nox); the metrics are in %s",
            metrics_jsonl);
    char table[4200];
    snprintf(table, sizeof table, "%s.plot.tsv", png);
    int rows = 0, have[N_COLUMNS] = {0};
    ctrl_status st = write_table(metrics_jsonl, table, &rows, have);
    if (st != CTRL_OK) return st;
    if (rows == 0) {
        remove(table);
        return ctrl_error_set(CTRL_ERR_RUNTIME, "no plot: %s has no logged step", metrics_jsonl);
    }
    FILE *g = popen("gnuplot >/dev/null 2>&1", "w");
    if (!g) {
        remove(table);
        return ctrl_error_set(CTRL_ERR_RUNTIME, "no plot: cannot run gnuplot: %s", strerror(errno));
    }
    /* Three panels sharing the step axis: loss (and entropy), grad_norm, learning rate and accuracy
     * (SFT) or the mean reward (online trainers). Only the columns the run logged are plotted: gnuplot
     * fails the whole plot on a series with no valid point (KTO logs no entropy or accuracy). */
    const int right = have[COL_REWARD] ? COL_REWARD : COL_ACCURACY;
    fprintf(g,
            "set terminal pngcairo size 1000,900 noenhanced\n"
            "set output '%s'\n"
            "set datafile missing '?'\n"
            "set key top right\nset grid\nset xlabel 'step'\n"
            "set multiplot layout 3,1 title 'ctrl training curves'\n",
            png);
    const int panels[3][2] = {{COL_LOSS, COL_ENTROPY}, {COL_GRAD_NORM, -1}, {COL_LR, right}};
    for (int p = 0; p < 3; p++) {
        if (p == 2 && have[right]) fputs("set y2tics\nset ytics nomirror\n", g);
        int n = 0;
        for (int i = 0; i < 2; i++) {
            const int c = panels[p][i];
            if (c < 0 || !have[c]) continue;
            fprintf(g, "%s'%s' using 1:%d%s with lines%s title '%s'", n++ ? ", " : "plot ", table, c + 1,
                    p == 2 && i == 1 ? " axes x1y2" : "", i == 0 ? " lw 2" : "", columns[c]);
        }
        fputs(n ? "\n" : "set multiplot next\n", g);
    }
    fputs("unset multiplot\n", g);
    int rc = pclose(g);
    remove(table);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0 || access(png, R_OK) != 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "no plot: gnuplot failed to write %s", png);
    return CTRL_OK;
}
