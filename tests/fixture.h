/* Reader of the binary fixtures written by tests/reference/fixture_io.py: a text header of
 * "name count" lines ending with "end", then float32 arrays in header order. */
#ifndef CTRL_TEST_FIXTURE_H
#define CTRL_TEST_FIXTURE_H

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

#endif
