/* The `checkpointing` memory strategy (activation / gradient checkpointing, TRL's default
 * gradient_checkpointing = true): the chosen layers keep only their input through the forward and
 * are recomputed from it in backward, trading one extra layer forward for their activations.
 * Options: every (recompute every Nth layer, counting from the first; 1 = all); keep_mlp (selective
 * checkpointing: the recomputed layers also keep their MLP's gate_proj/up_proj outputs, so the
 * recompute skips those products; ctrl_memory_ops.keep_mlp). */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_memory {
    long every;
    int keep_mlp;
};

static ctrl_status checkpointing_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                        ctrl_memory **out) {
    (void)host, (void)n_layers;
    ctrl_memory *m = calloc(1, sizeof *m);
    if (!m) return ctrl_error_set(CTRL_ERR_NOMEM, "memory checkpointing: out of memory");
    ctrl_status st = CTRL_OK;
    m->every = (long)ctrl_option_int(cfg, "checkpointing", "every", &st);
    if (st == CTRL_OK) m->keep_mlp = ctrl_option_bool(cfg, "checkpointing", "keep_mlp", &st);
    if (st != CTRL_OK) {
        free(m);
        return st;
    }
    *out = m;
    return CTRL_OK;
}

static int checkpointing_recompute(const ctrl_memory *m, int layer) { return layer % m->every == 0; }

static int checkpointing_keep_mlp(const ctrl_memory *m, int layer) {
    return m->keep_mlp && checkpointing_recompute(m, layer);
}

static void checkpointing_destroy(ctrl_memory *m) { free(m); }

static const ctrl_memory_ops checkpointing_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = checkpointing_create,
    .recompute = checkpointing_recompute,
    .destroy = checkpointing_destroy,
    .keep_mlp = checkpointing_keep_mlp,
};

static const ctrl_option checkpointing_options[] = {
    {.key = "every",
     .type = CTRL_OPT_INT,
     .default_value = "1",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 1,
     .doc = "Recompute every Nth layer (1 = every layer, the most memory saved)."},
    {.key = "keep_mlp",
     .type = CTRL_OPT_BOOL,
     .default_value = "false",
     .doc = "Selective checkpointing: each recomputed layer also keeps the outputs of its MLP's gate_proj "
            "and up_proj (and their LoRA adapters' x A^T) through the forward, so its recompute in backward "
            "skips those two products -- the largest of the layer, about two thirds of the recompute's "
            "multiplications at a Qwen2-like shape -- for 2 x intermediate_size floats a token per layer "
            "more (at Qwen2.5-0.5B's shape 0.93 MiB a token over 24 layers). The gradients are the same bit "
            "for bit. A mixture-of-experts layer keeps its own activations either way."},
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
