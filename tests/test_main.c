/* The runner behind tests/test.h. */
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include "test.h"

#define MAX_TESTS 1024

static struct {
    const char *name;
    test_fn fn;
} tests[MAX_TESTS];
static int n_tests;
int test_current_failed;
static int current_skipped;
static char skip_reason[512];

void test_register(const char *name, test_fn fn) {
    if (n_tests < MAX_TESTS) {
        tests[n_tests].name = name;
        tests[n_tests].fn = fn;
        n_tests++;
    }
}

void test_fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    test_current_failed++;
}

void test_skip(const char *why) {
    current_skipped = 1;
    snprintf(skip_reason, sizeof skip_reason, "%s", why);
}

uint64_t test_fresh_seed(void) {
    const char *env = getenv("CTRL_TEST_SEED");
    const uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) * 6364136223846793005ull | 1;
    printf("  seed %llu (CTRL_TEST_SEED replays it)\n", (unsigned long long)seed);
    return seed;
}

double test_rel_error_f64(const double *a, const double *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

double test_rel_error_f32(const float *a, const float *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

static int selected(int argc, char **argv, const char *name) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}

const char *test_tmp_dir(void) {
    static char dir[] = "/tmp/ctrl-test-XXXXXX";
    static int made = -1; /* a flag: the random suffix itself may end in 'X' */
    if (made < 0) made = mkdtemp(dir) != NULL;
    return made ? dir : NULL;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (!selected(argc, argv, tests[i].name)) continue;
        test_current_failed = 0;
        current_skipped = 0;
        tests[i].fn();
        if (test_current_failed) {
            printf("FAIL %s\n", tests[i].name);
            failed++;
        } else if (current_skipped) {
            printf("SKIP %s: %s\n", tests[i].name, skip_reason);
            skipped++;
        } else {
            printf("ok   %s\n", tests[i].name);
            passed++;
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed) return 1;
    if (skipped && !passed) return 77;
    return 0;
}
