/* ZeRO stage 2 on a CUDA model (see zero.h): the gradient partition of zero_layers.c on the device.
 * As a bucket of layers completes in the backward, its gradients (the model's device buffer) are
 * reduce-scattered over NCCL (ncclAvg: each rank receives its slice's average), each rank adds its
 * slice to its sums in device memory (`acc`, 1/N of the trainable floats) and zeroes the bucket for
 * the next backward; the step's norm, clipping and the optimizer (on the device) then read the sums,
 * and the updated slices are all-gathered over NCCL into every rank's device parameters. Nothing
 * crosses to the host but the norm's one double. */
#include "collective/collective.h"
#include "device/backend.h"
#include "train/zero.h"

int train_zero_wants_device(int stage, ctrl_model *m, int host_step) {
    return stage == 2 && !host_step && ctrl_model_device(m).type != CTRL_DEVICE_CPU;
}

ctrl_status train_zero_device_init(train_zero *z, ctrl_model *m) {
    const ctrl_backend_ops *be = ctrl_model_backend(m);
    if (z->overlap)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[memory] overlap_comm = true with zero2 on [run] device = cuda: not supported "
                              "yet (each bucket is reduced over NCCL when it completes)");
    ctrl_status st = ctrl_collective_device_init(); /* the NCCL communicator (a no-op on one rank) */
    if (st == CTRL_OK) st = be->alloc((void **)&z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    if (st == CTRL_OK) z->dev = be;
    if (st == CTRL_OK) st = be->fill_zero(z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    return st == CTRL_OK ? CTRL_OK
                         : ctrl_error_wrap(st, "zero2 on %s: %zu gradient floats", be->name, z->acc_n);
}

void train_zero_device_free(train_zero *z) {
    if (z->dev) z->dev->free(z->acc);
    z->dev = NULL, z->acc = NULL;
}

ctrl_status train_zero_device_finish_unit(train_zero *z, int u) {
    float *g = ctrl_model_device_grads(z->model, NULL) + z->units[u].a;
    const size_t len = z->units[u].b - z->units[u].a;
    ctrl_status st = ctrl_collective_device_reduce_scatter_mean_f32(g, train_zero_counts(z, u));
    size_t lo, hi;
    train_zero_slice(z, u, z->rank, &lo, &hi);
    float *acc = z->acc + z->acc_off[u];
    if (st == CTRL_OK && hi > lo) /* the slice's average added to its sums */
        st = z->dev->residual_forward(acc, acc, g + (lo - z->units[u].a), (int64_t)(hi - lo));
    return st == CTRL_OK ? z->dev->fill_zero(g, len * sizeof(float)) : st;
}

ctrl_status train_zero_device_sum_squares(train_zero *z, double *sum_sq) {
    ctrl_status st = z->acc_n ? z->dev->sum_squares(z->acc, (int64_t)z->acc_n, sum_sq) : CTRL_OK;
    return st == CTRL_OK ? ctrl_collective_allreduce_sum_f64(sum_sq, 1) : st;
}

ctrl_status train_zero_device_gather(train_zero *z, ctrl_model *m) {
    float *p = ctrl_model_device_params(m) + z->first;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++)
        st = ctrl_collective_device_allgather_f32(p + z->units[u].a, train_zero_counts(z, u));
    ctrl_model_device_weights_changed(m);
    return st;
}

void train_zero_device_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n) {
    (void)z;
    const float *host = ctrl_model_params(m, NULL);
    float *dev = ctrl_model_device_params(m);
    for (int i = 0; i < n; i++) groups[i].param = dev + (groups[i].param - host); /* grads: acc's already */
}
