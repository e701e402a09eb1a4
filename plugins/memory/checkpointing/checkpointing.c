/* The `checkpointing` memory strategy (activation / gradient checkpointing, TRL's default
 * gradient_checkpointing = true): the chosen layers keep only their input through the forward and
 * are recomputed from it in backward, trading one extra layer forward for their activations.
 * Option: every (recompute every Nth layer, counting from the first; 1 = all). */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_memory {
    long every;
};

static ctrl_status checkpointing_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                        ctrl_memory **out) {
    (void)host, (void)n_layers;
    ctrl_memory *m = calloc(1, sizeof *m);
    if (!m) return ctrl_error_set(CTRL_ERR_NOMEM, "memory checkpointing: out of memory");
    ctrl_status st = CTRL_OK;
    m->every = (long)ctrl_option_int(cfg, "checkpointing", "every", &st);
    if (st != CTRL_OK) {
        free(m);
        return st;
    }
    *out = m;
    return CTRL_OK;
}

static int checkpointing_recompute(const ctrl_memory *m, int layer) { return layer % m->every == 0; }

static void checkpointing_destroy(ctrl_memory *m) { free(m); }

static const ctrl_memory_ops checkpointing_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = checkpointing_create,
    .recompute = checkpointing_recompute,
    .destroy = checkpointing_destroy,
};

static const ctrl_option checkpointing_options[] = {
    {.key = "every",
     .type = CTRL_OPT_INT,
     .default_value = "1",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 1,
     .doc = "Recompute every Nth layer (1 = every layer, the most memory saved)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin checkpointing_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "checkpointing",
    .version = "0.1.0",
    .summary = "activation checkpointing: keep layer inputs, recompute the rest in backward",
    .options = checkpointing_options,
    .init = ctrl_plugin_api_init,
    .ops = &checkpointing_ops,
};

CTRL_PLUGIN_DEFINE(&checkpointing_plugin)
