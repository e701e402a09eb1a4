/* The `reward_model` reward: a learned reward model -- a *ForSequenceClassification directory, as
 * `trainer = reward` saves it or transformers' AutoModelForSequenceClassification loads it -- scores
 * each completion, as TRL's GRPOTrainer and RLOOTrainer score with a reward model passed as a
 * reward function: the text prompt + completion -- or, for a conversational prompt, its messages and
 * the completion as the assistant's message rendered with the reward model's chat template (its
 * end-of-turn included) -- tokenized by the reward model's tokenizer without special tokens,
 * batched, the score at each sequence's last non-pad token. The core loads and runs
 * the model (the host table's score_model_* entries) on the run's device with its attention. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_reward {
    ctrl_score_model *model;
    int batch_size;
};

static ctrl_status rm_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                             ctrl_reward **out) {
    (void)host; /* kept by init */
    ctrl_status st = CTRL_OK;
    const char *path = ctrl_option_string(cfg, section, "path", &st);
    const int batch_size = (int)ctrl_option_int(cfg, section, "batch_size", &st);
    const char *tokenizer = ctrl_config_get_string(cfg, section, "tokenizer");
    if (st != CTRL_OK) return st;
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "reward reward_model: out of memory");
    r->batch_size = batch_size;
    st = ctrl_score_model_open(cfg, path, tokenizer && *tokenizer ? tokenizer : NULL, &r->model);
    if (st != CTRL_OK) {
        free(r);
        return ctrl_error_wrap(st, "[%s]", section);
    }
    *out = r;
    return CTRL_OK;
}

static ctrl_status rm_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    char **texts = calloc((size_t)b->n + 1, sizeof *texts);
    ctrl_status st = texts ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "reward reward_model: out of memory");
    const char *const *messages =
        b->size >= offsetof(ctrl_reward_batch, prompt_messages) + sizeof(void *) ? b->prompt_messages : NULL;
    for (int i = 0; i < b->n && st == CTRL_OK; i++) {
        const char *p = b->prompts && b->prompts[i] ? b->prompts[i] : "",
                   *c = b->completions[i] ? b->completions[i] : "";
        if (messages && messages[i]) { /* the conversation with the reward model's own template */
            st = ctrl_score_model_chat_text(r->model, messages[i], c, &texts[i]);
            continue;
        }
        const size_t np = strlen(p), nc = strlen(c);
        if (!(texts[i] = malloc(np + nc + 1))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "reward reward_model: out of memory");
            break;
        }
        memcpy(texts[i], p, np), memcpy(texts[i] + np, c, nc + 1);
    }
    if (st == CTRL_OK)
        st = ctrl_score_model_score(r->model, (const char *const *)texts, b->n, r->batch_size, out);
    for (int i = 0; texts && i < b->n; i++) free(texts[i]);
    free(texts);
    return st;
}

static void rm_destroy(ctrl_reward *r) {
    if (!r) return;
    ctrl_score_model_close(r->model);
    free(r);
}

static const ctrl_reward_ops rm_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = rm_create,
    .score = rm_score,
    .destroy = rm_destroy,
};

static const ctrl_option rm_options[] = {
    {.key = "path",
     .type = CTRL_OPT_PATH,
     .flags = CTRL_OPT_REQUIRED,
     .doc = "The reward model: a *ForSequenceClassification directory (config.json + safetensors), as "
            "trainer = reward saves it."},
    {.key = "tokenizer",
     .type = CTRL_OPT_PATH,
     .doc = "Its tokenizer (a directory with tokenizer.json, or the file); default: the model directory's."},
    {.key = "batch_size",
     .type = CTRL_OPT_INT,
     .default_value = "64",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 1,
     .doc = "Completions scored per forward pass (memory only: the scores do not depend on it)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin rm_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "reward_model",
    .version = "0.1.0",
    .summary = "the score of a learned reward model (sequence classifier) on prompt + completion",
    .options = rm_options,
    .init = ctrl_plugin_api_init,
    .ops = &rm_ops,
};

CTRL_PLUGIN_DEFINE(&rm_plugin)
