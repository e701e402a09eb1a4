/* Reader of the binary fixtures written by tests/reference/fixture_io.py: a text header of
 * "name count" lines ending with "end", then float32 arrays in header order. */
#ifndef CTRL_TEST_FIXTURE_H
#define CTRL_TEST_FIXTURE_H

#include <stddef.h>

typedef struct fixture fixture;

/* NULL (with a message on stderr) when the file is missing or malformed. */
fixture *fixture_load(const char *path);
/* The named array and its length, or NULL. */
const float *fixture_get(const fixture *f, const char *name, long *n);
void fixture_free(fixture *f);
/* The named array, which must hold `want` values (want < 0: any number): a test failure naming it
 * and NULL otherwise. */
const float *fixture_array(const fixture *f, const char *name, long want);
/* The names of the files in `dir` ending in `suffix`, sorted (strcmp), at most `max`; each strdup'ed
 * (the caller frees them). Returns how many; a test failure when `dir` cannot be read. */
int fixture_list(const char *dir, const char *suffix, char **names, int max);
/* Each case of CTRL_FIXTURE_DIR/sub (its *.bin files, sorted, at most max) through run(ctx, dir,
 * file), dir being the folder's path. Returns how many there were. */
typedef void (*fixture_case_fn)(void *ctx, const char *dir, const char *file);
int fixture_each_case(const char *sub, int max, fixture_case_fn run, void *ctx);
/* dir/file loaded, its name (the file's less its ".bin") in name[cap]: NULL after a test failure
 * when it cannot be. */
fixture *fixture_open_case(const char *dir, const char *file, char *name, size_t cap);
/* A test failure unless loss is TRL's want within 1e-5 relative + 1e-7 (case name, micro-batch mb). */
void fixture_check_loss(const char *name, int mb, double loss, double want);

/* What a trainer reports (its report callback with the collector as ctx): each metric's sum and
 * number of calls, in order of first appearance; names past FIXTURE_MAX_METRICS are dropped. */
#define FIXTURE_MAX_METRICS 32
typedef struct fixture_metrics {
    char name[FIXTURE_MAX_METRICS][64];
    double sum[FIXTURE_MAX_METRICS];
    int count[FIXTURE_MAX_METRICS], n;
} fixture_metrics;
void fixture_metrics_report(void *ctx, const char *name, double value);
/* The mean of metric `name` in got against element i of the fixture's `count`-long array
 * "metric:NAME": a test failure unless within rel relative + abs absolute (either missing fails too);
 * *worst becomes the larger of it and the relative error. */
void fixture_metrics_check(const fixture *f, const fixture_metrics *got, const char *name, int i, long count,
                           double rel, double abs, double *worst);
/* Metric i of got (in case case_name) is one TRL logged (the fixture's "metric:NAME"; a test failure
 * otherwise) with its mean within rel relative + 1e-6 absolute, or NaN as TRL's when nan_ok. 1 when
 * compared. */
int fixture_metric_is_trls(const fixture *f, const fixture_metrics *got, int i, const char *case_name,
                           double rel, int nan_ok);

#endif
