/* Supervised fine-tuning: the negative log-likelihood of the trained tokens, summed over the
 * micro-batch and divided by the trained tokens of the whole accumulated batch (TRL's
 * num_items_in_batch), so gradient accumulation does not change the loss. The data side (formats,
 * masks, packing) and the loop live in the core. */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_trainer {
    int unused; /* no options, no state */
};

static ctrl_status sft_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host, (void)cfg;
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer sft: out of memory");
    *out = t;
    return CTRL_OK;
}

static ctrl_status sft_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    (void)t;
    if (!(b->num_items > 0))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer sft: the accumulated batch has no trained token");
    double sum = 0;
    const double inv = 1.0 / b->num_items;
    for (int i = 0; i < b->T; i++) {
        sum -= (double)b->weight[i] * b->logp[i];
        dlogp[i] = (float)(-b->weight[i] * inv);
    }
    *loss = sum * inv;
    return CTRL_OK;
}

static void sft_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops sft_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = sft_create,
    .loss = sft_loss,
    .destroy = sft_destroy,
    .dlogp_before_forward = 1, /* -weight / num_items */
};

static const ctrl_plugin sft_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "sft",
    .version = "0.1.0",
    .summary = "supervised fine-tuning: token-level NLL over trained tokens (TRL SFTTrainer)",
    .options = NULL,
    .init = ctrl_plugin_api_init,
    .ops = &sft_ops,
};

CTRL_PLUGIN_DEFINE(&sft_plugin)
