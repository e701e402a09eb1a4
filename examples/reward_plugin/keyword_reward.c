/* A third-party reward plugin, built out of tree against the installed headers:
 *
 *     cc -shared -fPIC $(pkg-config --cflags ctrl) keyword_reward.c -o keyword.so
 *     ctrl --plugin-dir . plugins
 *
 * Score: per_match times the number of (non-overlapping) occurrences of `keyword` in the
 * completion, capped at max_matches. It includes only <ctrl/plugin_api.h>, whose ctrl_error_set,
 * ctrl_option_* ... go through the host table the core lends it: the .so imports nothing from
 * ctrl. Its defaults live in its option table only. See docs/plugin-guide.md. */
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_reward {
    char *keyword;
    double per_match;
    long max_matches;
};

static ctrl_status keyword_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                  ctrl_reward **out) {
    (void)host; /* kept by init: ctrl_plugin_api_init */
    ctrl_status st = CTRL_OK;
    const char *kw = ctrl_option_string(cfg, section, "keyword", &st);
    const double per_match = ctrl_option_float(cfg, section, "per_match", &st);
    const long max_matches = (long)ctrl_option_int(cfg, section, "max_matches", &st);
    if (st != CTRL_OK) return st;
    if (!kw[0]) return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] keyword: must not be empty", section);
    ctrl_reward *r = calloc(1, sizeof *r);
    size_t n = strlen(kw) + 1;
    if (!r || !(r->keyword = malloc(n))) {
        free(r);
        return ctrl_error_set(CTRL_ERR_NOMEM, "reward keyword: out of memory");
    }
    memcpy(r->keyword, kw, n);
    r->per_match = per_match;
    r->max_matches = max_matches;
    *out = r;
    return CTRL_OK;
}

static ctrl_status keyword_score(ctrl_reward *r, const ctrl_reward_batch *batch, float *out) {
    size_t klen = strlen(r->keyword);
    for (int i = 0; i < batch->n; i++) {
        long count = 0;
        for (const char *p = batch->completions[i]; p && (p = strstr(p, r->keyword)); p += klen) count++;
        if (count > r->max_matches) count = r->max_matches;
        out[i] = (float)(r->per_match * (double)count);
    }
    return CTRL_OK;
}

static void keyword_destroy(ctrl_reward *r) {
    if (r) free(r->keyword);
    free(r);
}

static const ctrl_reward_ops keyword_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = keyword_create,
    .score = keyword_score,
    .destroy = keyword_destroy,
};

static const ctrl_option keyword_options[] = {
    {.key = "keyword", .type = CTRL_OPT_STRING, .flags = CTRL_OPT_REQUIRED, .doc = "Text to look for."},
    {.key = "per_match", .type = CTRL_OPT_FLOAT, .default_value = "1.0", .doc = "Reward per occurrence."},
    {.key = "max_matches",
     .type = CTRL_OPT_INT,
     .default_value = "1",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "Occurrences counted at most."},
    CTRL_OPTION_END,
};

static const ctrl_plugin keyword_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "keyword",
    .version = "1.0.0",
    .summary = "rewards completions that contain a keyword (example third-party plugin)",
    .options = keyword_options,
    .init = ctrl_plugin_api_init,
    .ops = &keyword_ops,
};

CTRL_PLUGIN_DEFINE(&keyword_plugin)
