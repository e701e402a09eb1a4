/* The `format` reward: 1.0 when the completion matches a pattern, else 0.0. By default TRL's
 * think_format_reward: re.match(r"^<think>(?!.*<think>)(.*?)</think>.*$", completion,
 * re.DOTALL | re.MULTILINE) — reasoning enclosed in one <think>...</think> block at the start. */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

#include "../reward_regex.h"

CTRL_PLUGIN_API_DEFINE;

#define THINK_PATTERN "^<think>(?!.*<think>)(.*?)</think>.*$"

struct ctrl_reward {
    pcre2_code *re;
    int mode;
};

static ctrl_status format_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                 ctrl_reward **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "reward format: out of memory");
    static const char *const modes[] = {"match", "search", "fullmatch", NULL};
    static const int rx_modes[] = {RX_MATCH, RX_SEARCH, RX_FULLMATCH};
    ctrl_status st = CTRL_OK;
    const int mode = ctrl_option_choice(cfg, section, "mode", modes, &st);
    if (st == CTRL_OK) r->mode = rx_modes[mode], st = rx_compile(cfg, section, &r->re);
    if (st != CTRL_OK) {
        free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

static ctrl_status format_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    for (int i = 0; i < b->n; i++)
        out[i] = rx_matches(r->re, b->completions[i] ? b->completions[i] : "", r->mode) == 1;
    return CTRL_OK;
}

static void format_destroy(ctrl_reward *r) {
    pcre2_code_free(r->re);
    free(r);
}

static const ctrl_reward_ops format_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = format_create,
    .score = format_score,
    .destroy = format_destroy,
};

static const ctrl_option format_options[] = {
    {"pattern", CTRL_OPT_STRING, THINK_PATTERN, 0, 0, 0, NULL,
     "PCRE2 pattern the completion must match (default: TRL's think_format_reward)."},
    {"mode", CTRL_OPT_CHOICE, "match", 0, 0, 0, "match|search|fullmatch",
     "Python's re.match (anchored at the start), re.search or re.fullmatch."},
    {"dotall", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL, "`.` matches newlines too (re.DOTALL)."},
    {"multiline", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL, "`^` and `$` match at line breaks (re.MULTILINE)."},
    {"ignore_case", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "Case-insensitive (re.IGNORECASE)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin format_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "format",
    .version = "0.1.0",
    .summary = "1 when the completion matches a pattern (default: TRL's <think>...</think> format), else 0",
    .options = format_options,
    .init = ctrl_plugin_api_init,
    .ops = &format_ops,
    .check_options = rx_check_options,
};

CTRL_PLUGIN_DEFINE(&format_plugin)
