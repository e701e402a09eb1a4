#include "fixture.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAX_ARRAYS 64

struct fixture {
    int n;
    char names[MAX_ARRAYS][64];
    long counts[MAX_ARRAYS];
    float *data[MAX_ARRAYS];
};

fixture *fixture_load(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "fixture %s: cannot open\n", path);
        return NULL;
    }
    fixture *f = calloc(1, sizeof *f);
    char line[256];
    int ok = 0;
    while (fgets(line, sizeof line, fp)) {
        if (line[0] == '#') continue;
        if (!strcmp(line, "end\n")) {
            ok = 1;
            break;
        }
        if (f->n == MAX_ARRAYS || sscanf(line, "%63s %ld", f->names[f->n], &f->counts[f->n]) != 2) break;
        f->n++;
    }
    for (int i = 0; ok && i < f->n; i++) {
        f->data[i] = malloc(sizeof(float) * (size_t)(f->counts[i] ? f->counts[i] : 1));
        if (!f->data[i] || fread(f->data[i], sizeof(float), (size_t)f->counts[i], fp) != (size_t)f->counts[i])
            ok = 0;
    }
    fclose(fp);
    if (!ok) {
        fprintf(stderr, "fixture %s: malformed\n", path);
        fixture_free(f);
        return NULL;
    }
    return f;
}

const float *fixture_get(const fixture *f, const char *name, long *n) {
    for (int i = 0; f && i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            if (n) *n = f->counts[i];
            return f->data[i];
        }
    if (n) *n = 0;
    return NULL;
}

void fixture_free(fixture *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->data[i]);
    free(f);
}

const float *fixture_array(const fixture *f, const char *name, long want) {
    long n = 0;
    const float *x = f ? fixture_get(f, name, &n) : NULL;
    CHECK_MSG(x && (want < 0 || n == want), "fixture array %s: %ld values, want %ld", name, n, want);
    return x;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int fixture_list(const char *dir, const char *suffix, char **names, int max) {
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d) return 0;
    const size_t ls = strlen(suffix);
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < max;) {
        const size_t l = strlen(de->d_name);
        if (l > ls && !strcmp(de->d_name + l - ls, suffix)) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    return n;
}

int fixture_each_case(const char *sub, int max, fixture_case_fn run, void *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", CTRL_FIXTURE_DIR, sub);
    char **files = calloc((size_t)max, sizeof *files);
    const int n = files ? fixture_list(dir, ".bin", files, max) : 0;
    for (int i = 0; i < n; i++) run(ctx, dir, files[i]), free(files[i]);
    free(files);
    return n;
}

fixture *fixture_open_case(const char *dir, const char *file, char *name, size_t cap) {
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const size_t len = strlen(file);
    snprintf(name, cap, "%.*s", (int)(len > 4 ? len - 4 : len), file);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    return f;
}

void fixture_check_loss(const char *name, int mb, double loss, double want) {
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want) + 1e-7, "%s mb%d: loss %.8g vs TRL %.8g", name, mb, loss,
              want);
}

void fixture_metrics_report(void *ctx, const char *name, double value) {
    fixture_metrics *m = ctx;
    int i = 0;
    while (i < m->n && strcmp(m->name[i], name)) i++;
    if (i == m->n) {
        if (m->n == FIXTURE_MAX_METRICS) return;
        snprintf(m->name[m->n++], sizeof m->name[0], "%s", name);
    }
    m->sum[i] += value, m->count[i]++;
}

int fixture_metric_is_trls(const fixture *f, const fixture_metrics *got, int i, const char *case_name,
                           double rel, int nan_ok) {
    char key[96];
    snprintf(key, sizeof key, "metric:%s", got->name[i]);
    long n = 0;
    const float *want = fixture_get(f, key, &n);
    CHECK_MSG(want != NULL, "%s: metric %s is not one TRL logs", case_name, got->name[i]);
    if (!want) return 0;
    const double mean = got->sum[i] / got->count[i];
    CHECK_MSG(fabs(mean - want[0]) <= rel * fabs(want[0]) + 1e-6 || (nan_ok && isnan(mean) && isnan(want[0])),
              "%s: %s = %.7g, TRL %.7g", case_name, got->name[i], mean, want[0]);
    return 1;
}

void fixture_metrics_check(const fixture *f, const fixture_metrics *got, const char *name, int i, long count,
                           double rel, double abs, double *worst) {
    char key[96];
    snprintf(key, sizeof key, "metric:%s", name);
    const float *want = fixture_array(f, key, count);
    int k = 0;
    while (k < got->n && strcmp(got->name[k], name)) k++;
    CHECK_MSG(want && k < got->n, "[%d] metric %s missing", i, name);
    if (!want || k == got->n) return;
    const double mean = got->sum[k] / got->count[k], err = fabs(mean - want[i]);
    if (err / fmax(fabs(want[i]), 1e-6) > *worst) *worst = err / fmax(fabs(want[i]), 1e-6);
    CHECK_MSG(err <= rel * fabs(want[i]) + abs, "[%d] %s = %.8g, TRL %.8g", i, name, mean, want[i]);
}
