/* Optimizer plugins (adamw, sgd): the kind's vtable. Parameters, gradients and states are flat
 * fp32 buffers with the same layout; groups carry per-group weight decay (none on norms/biases).
 * create() is given the device the model computes on: a plugin that can step there (through
 * host->device_kernels) gets groups of device pointers; one that cannot returns
 * CTRL_ERR_UNSUPPORTED and the core steps it on the CPU with host groups. */
#ifndef CTRL_OPTIMIZER_H
#define CTRL_OPTIMIZER_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_param_group {
    float *param;      /* fp32 master weights */
    const float *grad; /* fp32 gradients */
    int64_t numel;
    float weight_decay; /* 0 for norms and biases */
} ctrl_param_group;

typedef struct ctrl_optimizer ctrl_optimizer; /* the plugin's own state */

typedef struct ctrl_optimizer_ops {
    size_t size;
    /* Reads its options from `cfg` (section named after the plugin). */
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, const ctrl_param_group *groups,
                          int n_groups, ctrl_device device, ctrl_optimizer **out);
    /* One update at learning rate lr; `step` counts from 1 (bias correction). */
    ctrl_status (*step)(ctrl_optimizer *opt, const ctrl_param_group *groups, int n_groups, double lr,
                        int64_t step);
    /* Serialised state for checkpoints: named fp32 buffers, same layout as the params. */
    int (*state_count)(const ctrl_optimizer *opt);
    ctrl_status (*state_get)(ctrl_optimizer *opt, int i, const char **name, float **data, int64_t *numel);
    void (*destroy)(ctrl_optimizer *opt);
    /* Appended, optional (check `size`): an optimizer whose state lives on a device keeps the
     * buffers state_get returns as host copies, and this moves them: to_device = 0 before the
     * core reads them (a checkpoint save), 1 after it wrote them (a resume). */
    ctrl_status (*state_sync)(ctrl_optimizer *opt, int to_device);
    /* Appended, optional (check `size`): `step` with every gradient multiplied by grad_scale first,
     * as if the core had stored grad * grad_scale (global-norm clipping's factor, fused into the
     * update: the core then makes no pass of its own over the gradients, which stay unscaled). The
     * core asks it only of an optimizer stepping host memory; 1.0 is a plain step. */
    ctrl_status (*step_scaled)(ctrl_optimizer *opt, const ctrl_param_group *groups, int n_groups, double lr,
                               int64_t step, float grad_scale);
    /* Appended, optional (check `size`): the element type of state buffer i, for an optimizer that
     * keeps some state in other than fp32 (adamw_8bit's 8-bit moments: CTRL_U8). Where it is absent
     * every buffer is CTRL_F32; otherwise state_get's `data` points at `numel` elements of this type
     * (cast to float *), saved and restored byte for byte. */
    ctrl_dtype (*state_dtype)(const ctrl_optimizer *opt, int i);
    /* Appended, optional (check `size`): `step` of groups [g0, g1) of the n_groups only -- the same
     * values for those groups as a whole `step` gives them, the others untouched -- so that the core
     * can step one layer at a time and hand each to the device as soon as it is done
     * (offload_optimizer's overlap, core/train/offload_overlap.c). Every group is stepped exactly
     * once per `step` value, in any order, from one thread at a time. */
    ctrl_status (*step_groups)(ctrl_optimizer *opt, const ctrl_param_group *groups, int n_groups, double lr,
                               int64_t step, int g0, int g1);
} ctrl_optimizer_ops;

/* The element type of optimizer state buffer i (CTRL_F32 unless the plugin says otherwise). */
static inline ctrl_dtype ctrl_optimizer_state_dtype(const ctrl_optimizer_ops *ops, const ctrl_optimizer *opt,
                                                    int i) {
    return ops->size >= offsetof(ctrl_optimizer_ops, state_dtype) + sizeof ops->state_dtype &&
                   ops->state_dtype
               ? ops->state_dtype(opt, i)
               : CTRL_F32;
}

/* Appended: the options every Adam-family optimizer declares (adamw, adamw_8bit), as the HF Trainer
 * names them; each plugin reads them from its own section. */
/* clang-format off */
#define CTRL_ADAM_OPTIONS                                                                           \
    {"adam_beta1", CTRL_OPT_FLOAT, "0.9", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN, \
     0, 1, NULL, "Decay rate of the first-moment estimate."},                                      \
    {"adam_beta2", CTRL_OPT_FLOAT, "0.999", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN, \
     0, 1, NULL, "Decay rate of the second-moment estimate."},                                     \
    {"adam_epsilon", CTRL_OPT_FLOAT, "1e-8", CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, 0, 0, NULL,     \
     "Added to the denominator for numerical stability."}
/* clang-format on */

#ifdef __cplusplus
}
#endif
#endif
