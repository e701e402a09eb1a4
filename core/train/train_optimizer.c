/* The optimizer of a training run: its parameter groups and where it steps -- on the device's
 * buffers, on the host (an optimizer that cannot step on the device, or [memory] strategies =
 * offload_optimizer), or, with ZeRO, on this rank's slices. */
#include <stdlib.h>
#include <string.h>

#include "train/offload_overlap.h"
#include "train/train_run.h"

static void set_groups(run_state *r, float *params, float *grads) {
    r->n_groups = train_param_groups(r->model, params, grads, (float)r->s->train.weight_decay, r->groups);
}

/* offload_optimizer (no ZeRO, or zero3's slices): the host step overlapped with the next step's
 * compute (offload_overlap.c) unless [memory] offload_overlap = false or it cannot be; said either
 * way. */
static ctrl_status overlap_create(run_state *r) {
    const char *why = r->s->memory.offload_overlap ? NULL : "[memory] offload_overlap = false";
    if (!why && (r->kind_ops->optimizer_step || r->kind_ops == &train_kind_online ||
                 r->kind_ops == &train_kind_distill))
        why = "this trainer reads the weights between steps (generation, a second model's step)";
    ctrl_status st = CTRL_OK;
    train_zero *z = r->zero.host_step ? &r->zero : NULL;
    if (!why)
        st = train_offload_create(&r->ov, &why, r->model, r->opt_ops, r->opt, r->groups, r->n_groups, z);
    if (z) z->ov = r->ov;
    if (st == CTRL_OK && r->ov)
        CTRL_INFO(
            "offload_optimizer: the host step overlapped with the next step's compute, layer by layer "
            "([memory] offload_overlap = true: each layer%s stepped on a host thread in forward order and "
            "uploaded as soon as stepped; the next forward waits for each layer's upload alone%s); the "
            "host's parameters and gradients %s",
            z ? "'s slice" : "", z ? ", before its gather" : "",
            train_offload_pinned(r->ov) ? "page-locked" : "pageable (copies staged by the driver)");
    else if (st == CTRL_OK)
        CTRL_INFO("offload_optimizer: the host step not overlapped (%s): the whole %s stepped, then "
                  "copied to the device before the next forward",
                  why, z ? "rank's slices" : "model");
    return st;
}

/* One parameter group per trainable tensor (with LoRA the adapters and modules_to_save only:
 * the frozen base gets no optimizer state); norms and biases get no weight decay (as the HF
 * Trainer). On a device the optimizer is offered the device's buffers first; one that cannot
 * step there (CTRL_ERR_UNSUPPORTED) steps the host copies. With ZeRO the groups are clipped to
 * this rank's slice, stepped on the host. */
ctrl_status train_run_optimizer_create(run_state *r, int offload) {
    const ctrl_config *cfg = r->cfg;
    const ctrl_run_settings *s = r->s;
    const ctrl_host *host = ctrl_host_table();
    ctrl_status st;
    r->groups = calloc((size_t)ctrl_model_view_count(r->model), sizeof *r->groups);
    if (!r->groups) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    const ctrl_device dev = ctrl_model_device(r->model);
    if (strcmp(ctrl_config_where(cfg, "memory", "offload_overlap"), "default") != 0 &&
        (dev.type == CTRL_DEVICE_CPU || (r->zero.stage && !r->zero.host_step) || !(offload & 1)))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [memory] offload_overlap applies to offload_optimizer on a device run "
                              "without ZeRO or with zero3 only (here: %s)",
                              ctrl_config_where(cfg, "memory", "offload_overlap"),
                              !(offload & 1)  ? "no offload_optimizer"
                              : r->zero.stage ? "zero1 or zero2"
                                              : "the CPU");
    if (dev.type != CTRL_DEVICE_CPU && (offload & 1))
        CTRL_INFO("optimizer %s: steps on the host, its state in host memory ([memory] strategies = "
                  "offload_optimizer)",
                  s->train.optimizer);
    if (dev.type != CTRL_DEVICE_CPU && !r->zero.stage && !(offload & 1)) {
        set_groups(r, ctrl_model_device_params(r->model), ctrl_model_device_grads(r->model, NULL));
        st = r->opt_ops->create(host, cfg, r->groups, r->n_groups, dev, &r->opt);
        if (st == CTRL_OK) {
            r->opt_on_device = 1;
            CTRL_INFO("optimizer %s: steps on the device", s->train.optimizer);
            return CTRL_OK;
        }
        if (st != CTRL_ERR_UNSUPPORTED) return st;
        CTRL_INFO("optimizer %s: steps on the host (%s)", s->train.optimizer, ctrl_error_message());
    }
    set_groups(r, ctrl_model_params(r->model, NULL), ctrl_model_grads(r->model, NULL));
    if (dev.type != CTRL_DEVICE_CPU && !r->zero.stage && (offload & 1)) {
        st =
            r->opt_ops->create(host, cfg, r->groups, r->n_groups, (ctrl_device){CTRL_DEVICE_CPU, 0}, &r->opt);
        return st == CTRL_OK ? overlap_create(r) : st;
    }
    if (r->zero.stage) r->n_groups = train_zero_shard_groups(&r->zero, r->model, r->groups, r->n_groups);
    /* zero2 on a CUDA model: the slices (parameters and gradient sums) are the device's */
    /* (zero3 with offload_optimizer: on the host, the slices of the host's parameters) */
    const int on_dev = r->zero.dev && !r->zero.host_step;
    st = r->opt_ops->create(host, cfg, r->groups, r->n_groups,
                            on_dev ? dev : (ctrl_device){CTRL_DEVICE_CPU, 0}, &r->opt);
    if (on_dev && st == CTRL_ERR_UNSUPPORTED)
        return ctrl_error_wrap(
            st,
            "[memory] strategies = zero2 with [run] device = cuda: optimizer %s cannot step "
            "on the device (add offload_optimizer to step on the host)",
            s->train.optimizer);
    if (st == CTRL_OK && r->zero.host_step)
        CTRL_INFO(
            "optimizer %s: steps this rank's slices on the host (zero3 with offload_optimizer: its fp32 "
            "masters and state in host memory, the gradient sums reduce-scattered on the device and "
            "brought back, the updated slices copied to the device)",
            s->train.optimizer);
    if (st == CTRL_OK && on_dev) {
        r->opt_on_device = 1;
        CTRL_INFO(
            "optimizer %s: steps this rank's slices on the device (zero2: the gradients reduce-scattered "
            "over NCCL during the backward)",
            s->train.optimizer);
    }
    if (st == CTRL_OK) st = train_zero_report(&r->zero, s->train.optimizer, r->opt_ops, r->opt);
    if (st == CTRL_OK) st = train_zero_attach(&r->zero, r->model); /* zero3: the layers sliced */
    /* zero3 with offload_optimizer: the host step of the slices overlapped (after the attach: its
     * persistent tensors known) */
    if (st == CTRL_OK && r->zero.host_step) st = overlap_create(r);
    /* tests: what each rank holds now, to compare the sliced load with the whole one */
    if (st == CTRL_OK && r->zero.stage >= 3 && r->zero.size > 1 && getenv("CTRL_TEST_ZERO3_DIGEST"))
        st = train_zero_digest(&r->zero, r->model);
    return st;
}
