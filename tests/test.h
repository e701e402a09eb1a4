/* A minimal test harness. Each test file defines cases with TEST(name) { ... } and checks with
 * CHECK / CHECK_EQ_INT / CHECK_STR / CHECK_NEAR / CHECK_REL. tests/test_main.c runs every case
 * (or those named on the command line), prints one line per case and a closing
 * "N passed, N failed" line, and exits 1 when anything failed. A case may call TEST_SKIP(why):
 * when every case of a binary skips, the binary exits 77 and ctest reports it as skipped. */
#ifndef CTRL_TEST_H
#define CTRL_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*test_fn)(void);
/* This process's scratch directory under /tmp (made on first use; NULL if it cannot be). */
const char *test_tmp_dir(void);
void test_register(const char *name, test_fn fn);
void test_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);
extern int test_current_failed;

#define TEST(name)                                                                                           \
    static void test_##name(void);                                                                           \
    __attribute__((constructor)) static void test_reg_##name(void) { test_register(#name, test_##name); }    \
    static void test_##name(void)

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) test_fail_at(__FILE__, __LINE__, "CHECK(%s)", #cond);                                   \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                                 \
    do {                                                                                                     \
        if (!(cond)) test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                   \
    do {                                                                                                     \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                                \
        if (va_ != vb_) test_fail_at(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, va_, vb_);        \
    } while (0)

#define CHECK_STR(a, b)                                                                                      \
    do {                                                                                                     \
        const char *sa_ = (a), *sb_ = (b);                                                                   \
        if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0)                                                           \
            test_fail_at(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b, sa_ ? sa_ : "(null)",     \
                         sb_ ? sb_ : "(null)");                                                              \
    } while (0)

/* Substring check: haystack contains needle. */
#define CHECK_CONTAINS(hay, needle)                                                                          \
    do {                                                                                                     \
        const char *h_ = (hay), *n_ = (needle);                                                              \
        if (!h_ || !strstr(h_, n_))                                                                          \
            test_fail_at(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", n_);      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                                \
    do {                                                                                                     \
        double da_ = (double)(a), db_ = (double)(b);                                                         \
        if (!(fabs(da_ - db_) <= (tol)))                                                                     \
            test_fail_at(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, da_, db_,             \
                         (double)(tol));                                                                     \
    } while (0)

/* A seed for a test's random inputs: fresh each run (the clock), or CTRL_TEST_SEED's value to
 * replay a failure; printed either way. */
uint64_t test_fresh_seed(void);

/* Relative error of two arrays, ||a-b|| / ||b||; NaN never passes. */
double test_rel_error_f32(const float *a, const float *b, long n);
double test_rel_error_f64(const double *a, const double *b, long n);
#define CHECK_REL(a, b, n, tol)                                                                              \
    do {                                                                                                     \
        double e_ = test_rel_error_f32((a), (b), (n));                                                       \
        if (!(e_ <= (tol)))                                                                                  \
            test_fail_at(__FILE__, __LINE__, "rel error of %s vs %s = %.3g > %g", #a, #b, e_,                \
                         (double)(tol));                                                                     \
    } while (0)

#define TEST_SKIP(why)                                                                                       \
    do {                                                                                                     \
        test_skip(why);                                                                                      \
        return;                                                                                              \
    } while (0)

/* 1 in a build with AddressSanitizer (GCC's -fsanitize=address, clang's): several times slower, its
 * resident memory blurred by the quarantine and shadow. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN 0
#endif

#endif
