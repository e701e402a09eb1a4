/* Every rank of a data-parallel run must run the same configuration (see data_parallel.h): rank 0's
 * values go to every rank, which compares them with its own, key by key. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collective/collective.h"
#include "config/config_internal.h"
#include "train/data_parallel.h"

/* Rank 0's entries, "section\0key\0value\0" one after the other. */
static char *pack(const ctrl_config *cfg, uint64_t *len) {
    size_t n = 0;
    for (int i = 0; i < cfg->n; i++)
        n +=
            strlen(cfg->entries[i].section) + strlen(cfg->entries[i].key) + strlen(cfg->entries[i].value) + 3;
    char *buf = malloc(n ? n : 1), *at = buf;
    for (int i = 0; buf && i < cfg->n; i++) {
        const char *parts[3] = {cfg->entries[i].section, cfg->entries[i].key, cfg->entries[i].value};
        for (int k = 0; k < 3; k++)
            at = memcpy(at, parts[k], strlen(parts[k]) + 1), at += strlen(parts[k]) + 1;
    }
    *len = n;
    return buf;
}

/* Rank 0's value of [section] key in its packed entries, or NULL. */
static const char *theirs(const char *buf, uint64_t len, const char *section, const char *key) {
    for (const char *p = buf; p < buf + len;) {
        const char *s = p, *k = s + strlen(s) + 1, *v = k + strlen(k) + 1;
        if (!strcmp(s, section) && !strcmp(k, key)) return v;
        p = v + strlen(v) + 1;
    }
    return NULL;
}

/* The first key whose value differs from rank 0's (either way), as an error; CTRL_OK when none. */
static ctrl_status compare(const ctrl_config *cfg, const char *buf, uint64_t len) {
    for (const char *p = buf; p < buf + len;) {
        const char *s = p, *k = s + strlen(s) + 1, *v = k + strlen(k) + 1;
        p = v + strlen(v) + 1;
        const char *mine = ctrl_config_get_string(cfg, s, k);
        if (!mine)
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "the ranks run different configs: [%s] %s is not set here, = %s on rank 0: every "
                "rank must run the same config",
                s, k, v);
        if (strcmp(mine, v) != 0)
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "the ranks run different configs: [%s] %s = %s here (%s), %s on rank 0: every "
                "rank must run the same config",
                s, k, mine, ctrl_config_where(cfg, s, k), v);
    }
    for (int i = 0; i < cfg->n; i++) {
        const config_entry *e = &cfg->entries[i];
        if (!theirs(buf, len, e->section, e->key))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "the ranks run different configs: [%s] %s = %s here (%s), not set on rank 0: "
                "every rank must run the same config",
                e->section, e->key, e->value, e->where);
    }
    return CTRL_OK;
}

ctrl_status train_dp_agree_config(const ctrl_config *cfg) {
    if (ctrl_collective_size() == 1) return CTRL_OK;
    const int root = ctrl_collective_is_root();
    uint64_t len = 0;
    char *buf = root ? pack(cfg, &len) : NULL;
    ctrl_status st = root && !buf ? ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory") : CTRL_OK;
    if (st == CTRL_OK) st = ctrl_collective_broadcast(&len, sizeof len, 0);
    if (st == CTRL_OK && !root && !(buf = malloc(len ? len : 1)))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    if (st == CTRL_OK) st = ctrl_collective_broadcast(buf, len, 0);
    ctrl_status mine = st == CTRL_OK && !root ? compare(cfg, buf, len) : CTRL_OK;
    free(buf);
    if (st != CTRL_OK) return st;
    /* agreed: the first rank whose config differs, for the others' message */
    double first = mine != CTRL_OK ? -(double)ctrl_collective_rank() : -1e9;
    if ((st = ctrl_collective_allreduce_max_f64(&first, 1)) != CTRL_OK) return st;
    if (mine != CTRL_OK) return mine;
    if (first > -1e9)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "rank %d runs another config than rank 0 (its message names the key)",
                              (int)-first);
    return CTRL_OK;
}
