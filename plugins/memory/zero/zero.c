/* The ZeRO memory strategies (DeepSpeed's Zero Redundancy Optimizer, stages 1 and 2) for data
 * parallel runs (`mpirun -np N ctrl train`):
 *   zero1: the optimizer state is partitioned over the ranks: the trainable parameters, as one flat
 *          buffer, are cut in N consecutive slices; rank r creates its optimizer for slice r only
 *          (1/N of AdamW's exp_avg and exp_avg_sq), steps it with the averaged gradients, and the
 *          updated slices are all-gathered so every rank holds the whole model again;
 *   zero2: the same, and the gradients are reduce-scattered instead of all-reduced: each rank
 *          receives the average of its own slice only (half an allreduce's traffic); on the CPU
 *          during the backward, in buckets of layers ([memory] reduce_bucket_size), each rank
 *          keeping only its slices' averages;
 *   zero3: the same per layer, and the parameters too: each rank keeps its slice of every layer,
 *          which is all-gathered just before the layer's forward and backward and released after
 *          (on the CPU in fp32 so far; embeddings, final norm and head kept whole; generation
 *          gathers the whole model around it).
 * The plugin declares the stage; the core's step loop does the partitioning, the collectives and
 * the sharded checkpoints (core/train/zero.c), so that every trainer kind and optimizer plugin
 * gets it. On one rank both are plain training. */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_memory {
    int stage;
};

static ctrl_status create_stage(int stage, ctrl_memory **out) {
    ctrl_memory *m = calloc(1, sizeof *m);
    if (!m) return ctrl_error_set(CTRL_ERR_NOMEM, "memory zero%d: out of memory", stage);
    m->stage = stage;
    *out = m;
    return CTRL_OK;
}

static ctrl_status zero1_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                ctrl_memory **out) {
    (void)host, (void)cfg, (void)n_layers;
    return create_stage(1, out);
}

static ctrl_status zero2_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                ctrl_memory **out) {
    (void)host, (void)cfg, (void)n_layers;
    return create_stage(2, out);
}

static ctrl_status zero3_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                ctrl_memory **out) {
    (void)host, (void)cfg, (void)n_layers;
    return create_stage(3, out);
}

static int zero_stage(const ctrl_memory *m) { return m->stage; }

static void zero_destroy(ctrl_memory *m) { free(m); }

static const ctrl_memory_ops zero1_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = zero1_create,
    .destroy = zero_destroy,
    .zero_stage = zero_stage,
};

static const ctrl_memory_ops zero2_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = zero2_create,
    .destroy = zero_destroy,
    .zero_stage = zero_stage,
};

static const ctrl_memory_ops zero3_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = zero3_create,
    .destroy = zero_destroy,
    .zero_stage = zero_stage,
};

static const ctrl_plugin zero1_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "zero1",
    .version = "0.1.0",
    .summary = "ZeRO stage 1 (DeepSpeed): optimizer state partitioned over the data-parallel ranks",
    .init = ctrl_plugin_api_init,
    .ops = &zero1_ops,
};

static const ctrl_plugin zero2_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "zero2",
    .version = "0.1.0",
    .summary = "ZeRO stage 2 (DeepSpeed): optimizer state partitioned, gradients reduce-scattered",
    .init = ctrl_plugin_api_init,
    .ops = &zero2_ops,
};

static const ctrl_plugin zero3_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "zero3",
    .version = "0.1.0",
    .summary = "ZeRO stage 3 (DeepSpeed): parameters too, each layer gathered for its forward and backward",
    .init = ctrl_plugin_api_init,
    .ops = &zero3_ops,
};

CTRL_PLUGIN_DEFINE(&zero1_plugin, &zero2_plugin, &zero3_plugin)
