/* The optimizer of a training run: its parameter groups and where it steps -- on the device's
 * buffers, on the host (an optimizer that cannot step on the device, or [memory] strategies =
 * offload_optimizer), or, with ZeRO, on this rank's slices. */
#include <stdlib.h>

#include "train/train_run.h"

static void set_groups(run_state *r, float *params, float *grads) {
    r->n_groups = train_param_groups(r->model, params, grads, (float)r->s->train.weight_decay, r->groups);
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
    return st == CTRL_OK ? train_zero_attach(&r->zero, r->model) : st; /* zero3: the layers sliced */
}
