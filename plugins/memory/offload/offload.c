/* The `offload_optimizer` memory strategy (DeepSpeed's zero_optimization.offload_optimizer, TRL's
 * co-location recipes): on a device (`[run] device = cuda`) the optimizer's state lives in host
 * memory and its step runs on the host -- the gradients come back to the host after the backward,
 * the host AdamW updates the fp32 master weights there, and the updated weights go back to the
 * device before the next forward -- so the device holds no exp_avg / exp_avg_sq (8 bytes a
 * parameter with AdamW). The core's step loop does it (core/train/train_optimizer.c places the
 * optimizer, train_step.c steps it); the plugin says so. On the CPU there is nothing to offload:
 * the run is refused, naming the key. The host step runs layer by layer beside the next step's
 * forward, each layer uploaded as soon as stepped and waited for just before its forward
 * (core/train/offload_overlap.c; [memory] offload_overlap = false: the whole model at once).
 *
 * `offload_activations` (TRL's activation_offloading): with activation checkpointing, what a layer
 * keeps through the forward is its input; those inputs leave the compute memory right after each
 * layer's forward and come back just before its backward (the model does it,
 * ctrl_model_set_offload_activations), two of them kept instead of one per layer: on a device run
 * they go to host memory, on the CPU to a file in [memory] offload_dir (NVMe offload). */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_memory {
    int unused;
};

static ctrl_status offload_create(const ctrl_host *host, const ctrl_config *cfg, int n_layers,
                                  ctrl_memory **out) {
    (void)host, (void)cfg, (void)n_layers;
    *out = calloc(1, sizeof **out);
    return *out ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "memory offload: out of memory");
}

static int offload_optimizer(const ctrl_memory *m) {
    (void)m;
    return 1;
}

static void offload_destroy(ctrl_memory *m) { free(m); }

static const ctrl_memory_ops offload_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = offload_create,
    .destroy = offload_destroy,
    .offload_optimizer = offload_optimizer,
};

static int offload_activations(const ctrl_memory *m) {
    (void)m;
    return 1;
}

static const ctrl_memory_ops activations_ops = {
    .size = sizeof(ctrl_memory_ops),
    .create = offload_create,
    .destroy = offload_destroy,
    .offload_activations = offload_activations,
};

static const ctrl_plugin activations_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "offload_activations",
    .version = "0.1.0",
    .summary = "checkpointed layer inputs out of the compute memory between forward and backward: host "
               "memory on a device run, a file on the CPU (TRL's activation_offloading)",
    .init = ctrl_plugin_api_init,
    .ops = &activations_ops,
};

static const ctrl_plugin offload_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_MEMORY,
    .name = "offload_optimizer",
    .version = "0.1.0",
    .summary = "optimizer state and step in host memory on a device run (DeepSpeed's offload_optimizer)",
    .init = ctrl_plugin_api_init,
    .ops = &offload_ops,
};

CTRL_PLUGIN_DEFINE(&offload_plugin, &activations_plugin)
