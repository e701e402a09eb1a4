/* The `regex` reward: `score` when the pattern occurs in the completion (re.search), else
 * `else_score`; with count = true, score times the number of non-overlapping matches
 * (len(re.findall(...))), or else_score when there is none. */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

#include "../reward_regex.h"

CTRL_PLUGIN_API_DEFINE;

struct ctrl_reward {
    pcre2_code *re;
    double score, else_score;
    int count;
};

static ctrl_status regex_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                ctrl_reward **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "reward regex: out of memory");
    ctrl_status st = CTRL_OK;
    r->score = ctrl_option_float(cfg, section, "score", &st);
    r->else_score = ctrl_option_float(cfg, section, "else_score", &st);
    r->count = ctrl_option_bool(cfg, section, "count", &st);
    if (st == CTRL_OK) st = rx_compile(cfg, section, &r->re);
    if (st != CTRL_OK) {
        free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

static ctrl_status regex_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    for (int i = 0; i < b->n; i++) {
        const char *text = b->completions[i] ? b->completions[i] : "";
        const long n = r->count ? rx_count(r->re, text) : rx_matches(r->re, text, RX_SEARCH);
        out[i] = (float)(n > 0 ? r->score * (r->count ? (double)n : 1.0) : r->else_score);
    }
    return CTRL_OK;
}

static void regex_destroy(ctrl_reward *r) {
    pcre2_code_free(r->re);
    free(r);
}

static const ctrl_reward_ops regex_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = regex_create,
    .score = regex_score,
    .destroy = regex_destroy,
};

static const ctrl_option regex_options[] = {
    {"pattern", CTRL_OPT_STRING, NULL, CTRL_OPT_REQUIRED, 0, 0, NULL,
     "PCRE2 pattern searched for in the completion."},
    {"score", CTRL_OPT_FLOAT, "1.0", 0, 0, 0, NULL,
     "Reward when the pattern occurs (per match with count = true)."},
    {"else_score", CTRL_OPT_FLOAT, "0.0", 0, 0, 0, NULL, "Reward when it does not."},
    {"count", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "Score every non-overlapping match (re.findall)."},
    {"dotall", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "`.` matches newlines too (re.DOTALL)."},
    {"multiline", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "`^` and `$` match at line breaks (re.MULTILINE)."},
    {"ignore_case", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "Case-insensitive (re.IGNORECASE)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin regex_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "regex",
    .version = "0.1.0",
    .summary = "a score when a pattern occurs in the completion (or per match), else another",
    .options = regex_options,
    .init = ctrl_plugin_api_init,
    .ops = &regex_ops,
    .check_options = rx_check_options,
};

CTRL_PLUGIN_DEFINE(&regex_plugin)
