/* The optimizer tests' plugin host (optimizer_host.h): option readers over a table of
 * hyper-parameters, the host's error_set, and AddressSanitizer's setting for the out-of-memory
 * cases. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/status.h>

#include "optimizer/optimizer_host.h"

static double hp_get(const ctrl_config *cfg, const char *section, const char *key, ctrl_status *st) {
    const test_hp_table *t = (const test_hp_table *)cfg;
    for (int i = 0; *st == CTRL_OK && t && i < t->n; i++)
        if (!strcmp(t->key[i], key)) return t->val[i];
    if (*st == CTRL_OK) *st = ctrl_error_set(CTRL_ERR_CONFIG, "[%s] %s: has no value", section, key);
    return 0;
}
static double host_option_float(const ctrl_config *cfg, const char *s, const char *k, ctrl_status *st) {
    return hp_get(cfg, s, k, st);
}
static int64_t host_option_int(const ctrl_config *cfg, const char *s, const char *k, ctrl_status *st) {
    return (int64_t)hp_get(cfg, s, k, st);
}
static bool host_option_bool(const ctrl_config *cfg, const char *s, const char *k, ctrl_status *st) {
    return hp_get(cfg, s, k, st) != 0;
}
static ctrl_status host_error_set(ctrl_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ctrl_error_set(st, "%s", buf);
}
const ctrl_host test_optimizer_host = {
    .size = sizeof(ctrl_host),
    .abi = CTRL_PLUGIN_ABI,
    .error_set = host_error_set,
    .option_float = host_option_float,
    .option_int = host_option_int,
    .option_bool = host_option_bool,
};

void test_hp_set(test_hp_table *t, const char *key, double value) {
    int i = 0;
    while (i < t->n && strcmp(t->key[i], key) != 0) i++;
    if (i == 8) return; /* full: the tests set at most a handful */
    snprintf(t->key[i], sizeof t->key[0], "%s", key);
    t->val[i] = value;
    if (i == t->n) t->n++;
}

void test_hp_fill_defaults(test_hp_table *t, const ctrl_plugin *p) {
    for (const ctrl_option *o = p->options; o && o->key; o++) {
        int have = 0;
        for (int i = 0; i < t->n; i++) have |= !strcmp(t->key[i], o->key);
        if (have || !o->default_value || t->n == 8) continue;
        snprintf(t->key[t->n], sizeof t->key[0], "%s", o->key);
        t->val[t->n++] =
            o->type == CTRL_OPT_BOOL ? !strcmp(o->default_value, "true") : atof(o->default_value);
    }
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1 /* clang 14 does not define __SANITIZE_ADDRESS__ */
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(TEST_UNDER_ASAN)
/* Under AddressSanitizer, an impossible allocation returns NULL (as libc's does) instead of
 * aborting, so that the tests' out-of-memory cases run there too. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif
