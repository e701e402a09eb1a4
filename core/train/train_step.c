/* One optimizer step of a training run: the trainer kind accumulates the micro-batches' gradients
 * (this rank's share, averaged over the ranks), then their norm, the health check, global-norm
 * clipping, the optimizer, and the first step's memory marks. */
#include <math.h>
#include <string.h>

#include "train/offload_overlap.h"
#include "train/train_run.h"

/* One optimizer step: the kind accumulates the gradients of `ga` micro-batches of `bs` rows taken
 * from order[*cursor...] (this rank's share of them, averaged over the ranks); then their norm, the
 * health check, clipping, the optimizer. */
ctrl_status train_run_step(run_state *r, const int *order, long *cursor, int bs, int ga, double lr, long step,
                           train_step_stats *out, double *grad_norm) {
    memset(out, 0, sizeof *out);
    const long start = *cursor;
    long mine = start;
    const int on_device = ctrl_model_device(r->model).type != CTRL_DEVICE_CPU;
    train_memory_mark(&r->mem); /* the first step only: before it, after the backward, at its end */
    ctrl_status st = train_zero_zero_grad(&r->zero, r->model); /* zero3: the units outside the layers */
    ctrl_model_set_training(r->model, 1, (uint64_t)step); /* LoRA dropout: masks a function of the step */
    if (st == CTRL_OK)
        st = r->kind_ops->accumulate(r->kind, train_dp_share(&r->dp, order, start), &mine, bs, ga, out);
    ctrl_model_set_training(r->model, 0, 0);
    st = train_dp_reduce_step(&r->dp, st, out);
    *cursor = train_dp_advance(&r->dp, start, mine);
    if (r->mem.marks == 1) train_memory_mark(&r->mem);
    double sum_sq = 0;
    if (r->zero.stage) { /* this rank's slice, on the host */
        if (st == CTRL_OK) st = train_zero_reduce_grads(&r->zero, r->model, &sum_sq);
    } else {
        if (st == CTRL_OK) st = train_dp_average_grads(&r->dp, r->model, on_device);
        if (st == CTRL_OK) st = ctrl_model_grad_sum_squares(r->model, &sum_sq); /* on the model's backend */
    }
    if (st != CTRL_OK) return st;
    *grad_norm = sqrt(sum_sq);
    if ((st = train_health_step(step, out->loss, *grad_norm)) != CTRL_OK) return st;
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1. */
    /* On the CPU an optimizer that can scales the gradients as it reads them (step_scaled): one
     * pass less over them, the same values. */
    const ctrl_optimizer_ops *oo = r->opt_ops;
    const int fuse = !on_device && !r->zero.stage &&
                     oo->size >= offsetof(ctrl_optimizer_ops, step_scaled) + sizeof oo->step_scaled &&
                     oo->step_scaled;
    float scale = 1.0f;
    const double max_norm = r->s->train.max_grad_norm;
    if (max_norm > 0) {
        double coef = max_norm / (*grad_norm + 1e-6);
        if (coef < 1 && r->zero.stage) st = train_zero_scale_grads(&r->zero, r->model, (float)coef);
        if (coef < 1 && fuse) scale = (float)coef;
        if (coef < 1 && !r->zero.stage && !fuse) st = ctrl_model_scale_grads(r->model, (float)coef);
    }
    if (st == CTRL_OK) st = train_offload_drain(r->ov); /* the last step's host step (done by now) */
    if (st == CTRL_OK && !r->opt_on_device && !r->zero.stage) st = ctrl_model_grads_to_host(r->model);
    if (st == CTRL_OK && r->ov) /* offload_optimizer: stepped layer by layer beside the next forward */
        st = train_offload_launch(r->ov, lr, step + 1);
    else if (st == CTRL_OK)
        st = fuse ? oo->step_scaled(r->opt, r->groups, r->n_groups, lr, step + 1, scale)
                  : oo->step(r->opt, r->groups, r->n_groups, lr, step + 1);
    /* (overlapped under zero3: each unit put on the devices before its gather, offload_overlap.c) */
    if (st == CTRL_OK && r->zero.stage && !r->ov) st = train_zero_gather_params(&r->zero, r->model);
    if (st == CTRL_OK && r->kind_ops->optimizer_step) st = r->kind_ops->optimizer_step(r->kind, lr, step + 1);
    if (r->opt_on_device || r->zero.host_step) /* zero3 offload: the slices copied to the device */
        ctrl_model_device_weights_changed(r->model);
    else if (!r->ov) /* overlapped: each layer's upload is waited for where it is read */
        ctrl_model_weights_changed(r->model);
    if (st == CTRL_OK && r->kind_ops->after_step) st = r->kind_ops->after_step(r->kind, step + 1);
    if (st == CTRL_OK && r->mem.marks == 2) {
        train_memory_mark(&r->mem);
        if (r->root && ctrl_model_device(r->model).type == CTRL_DEVICE_CPU) { /* host memory is the model's */
            size_t n = 0, ng = 0, sliced[2];
            const float *p = ctrl_model_params(r->model, &n), *g = ctrl_model_grads(r->model, &ng);
            if (r->zero.stage >= 3) { /* what the pages hold (this rank's slices, what is whole), the sums */
                sliced[0] = train_zero_resident(p, n * sizeof *p);
                sliced[1] = train_zero_resident(g, ng * sizeof *g) + r->zero.acc_n * sizeof(float);
            }
            train_memory_log(&r->mem, r->model, r->s->train.optimizer, r->zero.stage >= 3 ? sliced : NULL);
        }
    }
    return st;
}
