/* Memory-strategy plugins (checkpointing, zero1, zero2, zero3, offload_optimizer): hooks around each layer
 * and step. */
#ifndef CTRL_MEMORY_H
#define CTRL_MEMORY_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_memory ctrl_memory; /* the plugin's own state */

typedef struct ctrl_memory_ops {
    size_t size;
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, int n_layers, ctrl_memory **out);
    /* Each hook is optional (NULL = nothing to do). `layer` counts from 0. */
    ctrl_status (*before_forward)(ctrl_memory *m, int layer);
    ctrl_status (*after_forward)(ctrl_memory *m, int layer);
    ctrl_status (*before_backward)(ctrl_memory *m, int layer);
    ctrl_status (*after_backward)(ctrl_memory *m, int layer);
    ctrl_status (*before_step)(ctrl_memory *m);
    ctrl_status (*after_step)(ctrl_memory *m);
    /* 1 when layer activations should be dropped after forward and recomputed in backward. */
    int (*recompute)(const ctrl_memory *m, int layer);
    void (*destroy)(ctrl_memory *m);
    /* Appended, optional (check `size`; NULL: not a sharding strategy). A ZeRO strategy (zero1,
     * zero2) says its stage, with DeepSpeed's meaning, and the core's step loop carries it out over
     * the data-parallel ranks (core/train/zero.c): 1 each rank keeps and steps the optimizer state
     * of its slice of the trainable parameters, which are all-gathered after the step; 2 the
     * gradients are also reduce-scattered (each rank gets the average of its slice only); 3 the
     * parameters too (each layer gathered around its forward and backward, the core's hooks). A
     * sharding strategy may be listed beside one that hooks the layers (checkpointing). */
    int (*zero_stage)(const ctrl_memory *m);
    /* Appended, optional (check `size`; NULL: no). 1: the optimizer's state and step go to host
     * memory on a device run (offload_optimizer): the core steps the host copies there. Listed
     * beside the other strategies. */
    int (*offload_optimizer)(const ctrl_memory *m);
    /* Appended, optional (check `size`; NULL: no). 1: the inputs of the layers the layer strategy
     * recomputes are kept in host memory between their forward and their backward on a device run
     * (offload_activations, TRL's activation_offloading): the core's model does the copies. Listed
     * beside a layer strategy that recomputes (checkpointing). */
    int (*offload_activations)(const ctrl_memory *m);
    /* Appended, optional (check `size`; NULL: no). 1: a layer this strategy recomputes also keeps
     * the outputs of its MLP's gate_proj and up_proj (and their LoRA adapters' s x A^T) through the
     * forward, so that its recompute skips those two products, the largest of the layer (selective
     * checkpointing: 2 x intermediate_size floats a token more per layer, for about two thirds of the
     * recompute's multiplications at a Qwen2-like shape); a mixture-of-experts layer keeps its own. */
    int (*keep_mlp)(const ctrl_memory *m, int layer);
} ctrl_memory_ops;

#ifdef __cplusplus
}
#endif
#endif
