/* The `length` reward: -|target_length - length(completion)|, TRL's reward_len example
 * generalised. Length counts Unicode code points of the completion text (as Python's len() on a
 * str does), or tokens with unit = tokens. */
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_reward {
    long target;
    int tokens; /* 1: count token ids; 0: count code points */
};

static ctrl_status length_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                 ctrl_reward **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "reward length: out of memory");
    static const char *const units[] = {"chars", "tokens", NULL};
    ctrl_status st = CTRL_OK;
    r->target = (long)ctrl_option_int(cfg, section, "target_length", &st);
    r->tokens = ctrl_option_choice(cfg, section, "unit", units, &st) == 1;
    if (st != CTRL_OK) {
        free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

/* Code points of UTF-8 text: every byte that is not a continuation byte starts one. */
static long utf8_length(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static ctrl_status length_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    for (int i = 0; i < b->n; i++) {
        long len =
            r->tokens ? (long)b->completion_lens[i] : utf8_length(b->completions[i] ? b->completions[i] : "");
        out[i] = -(float)labs(r->target - len);
    }
    return CTRL_OK;
}

static void length_destroy(ctrl_reward *r) { free(r); }

static const ctrl_reward_ops length_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = length_create,
    .score = length_score,
    .destroy = length_destroy,
};

static const ctrl_option length_options[] = {
    {.key = "target_length",
     .type = CTRL_OPT_INT,
     .default_value = "20",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "The length that scores 0; every unit away from it costs 1."},
    {.key = "unit",
     .type = CTRL_OPT_CHOICE,
     .default_value = "chars",
     .choices = "chars|tokens",
     .doc = "Count Unicode characters of the completion text, or its tokens."},
    CTRL_OPTION_END,
};

static const ctrl_plugin length_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "length",
    .version = "0.1.0",
    .summary = "-|target_length - len(completion)| (TRL's reward_len example)",
    .options = length_options,
    .init = ctrl_plugin_api_init,
    .ops = &length_ops,
};

CTRL_PLUGIN_DEFINE(&length_plugin)
