/* What each rank of a training run holds in memory, logged by rank 0: after loading the model, after
 * the first step of a partitioned ZeRO run (host or device), and offload_activations' layout. */
#include <stdint.h>

#include "collective/collective.h"
#include "train/train_run.h"

/* Several ranks: each rank's resident memory right after loading the model (its peak so far is the
 * loading's), the most over the ranks logged by rank 0 -- what zero3's sliced loading lowers. */
ctrl_status train_run_report_load_memory(const run_state *r, int sliced) {
    if (ctrl_collective_size() < 2) return CTRL_OK;
    double v[2];
    train_memory_read(&v[0], &v[1]);
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
    if (st == CTRL_OK && r->root)
        CTRL_INFO("after loading the model%s: process memory per rank at most %.0f kB, %.0f kB at its peak "
                  "(VmRSS, VmHWM)",
                  sliced ? " (zero3: each rank's slices)" : " (whole on every rank)", v[0], v[1]);
    return st;
}

/* zero3, rank 0: what the first step all-gathered -- the layers' uses, then the units kept whole (on a
 * CUDA model the layers' and the persistent views' gathers only) -- and what
 * stage3_param_persistence_threshold keeps whole. */
static void log_gathers(train_zero *z) {
    long gathers = 0, views = 0;
    double floats = 0;
    train_zero_gather_counts(z, &gathers, &views, &floats);
    CTRL_INFO("zero3: the step all-gathered %.0f parameter floats in %ld collectives, %ld tensors around "
              "their uses and persistent (stage3_param_persistence_threshold = %zu elements: %d tensors, "
              "%zu bytes, whole on every rank)",
              floats, gathers, views, z->persist, z->n_persist, z->persist_bytes);
}

/* After the first step of a partitioned ZeRO run: the gradient memory each rank held during the
 * backward (the most resident just before a bucket's reduction) and, zero3, the parameter and
 * gradient memory between steps (mincore), logged by rank 0. */
ctrl_status train_run_report_resident(run_state *r) {
    size_t n_params = 0, n_grads = 0;
    if (r->zero.vm_params) { /* zero3 on a CUDA model: what each rank holds mapped in device memory */
        n_params = ctrl_model_param_bytes(r->model) / sizeof(float); /* not ctrl_model_params: no copy */
        ctrl_model_grads(r->model, &n_grads);
        double v[8] = {0};
        const size_t piece = train_zero_device_mapped(&r->zero, v);
        v[4] = (double)(r->zero.acc_n * sizeof(float)), /* offload_optimizer: the state is the host's */
            v[5] = r->zero.host_step ? 0 : (double)train_zero_state_bytes(r->opt_ops, r->opt);
        ctrl_status st = ctrl_collective_allreduce_max_f64(v, 6);
        if (st == CTRL_OK && r->root)
            CTRL_INFO(
                "zero3 on the device: per rank between steps at most %.0f of the model's %zu bytes of "
                "parameters (layers, embeddings and head %zu bytes, sliced over %d ranks), %.0f of %zu bytes "
                "of gradients, %.0f "
                "bytes of gradient slices' sums and %.0f of optimizer state; the most mapped in the first "
                "step: "
                "parameters %.0f, gradients %.0f bytes (pieces of %zu bytes); %ld layer gathers prefetched "
                "(prefetch_bucket_size = %zu floats)",
                v[0], n_params * sizeof(float), train_zero_layer_bytes(&r->zero), r->zero.size, v[2],
                n_grads * sizeof(float), v[4], v[5], v[1], v[3], piece, r->zero.prefetched, r->zero.prefetch);
        if (st == CTRL_OK && r->root) log_gathers(&r->zero);
        if (st == CTRL_OK) st = train_zero_nf4_report(&r->zero); /* QLoRA: the device's NF4 slices */
        if (st != CTRL_OK || !r->zero.b16) return st;
        double b[3] = {0}; /* bf16: the masters apart, the bf16 copy's slices */
        train_zero_device_b16_mapped(&r->zero, b);
        b[2] = r->zero.master ? (double)(r->zero.master_n * sizeof(float)) : 0; /* offload: the host's */
        st = ctrl_collective_allreduce_max_f64(b, 3);
        if (st == CTRL_OK && r->root)
            CTRL_INFO(
                "zero3 on the device in bf16: per rank between steps %.0f bytes of the layers' fp32 master "
                "slices and %.0f of the bf16 copy's %zu bytes (its slices); the most of it mapped in the "
                "first "
                "step %.0f bytes; the layers gathered as bf16 (2 bytes a parameter over NCCL), gradients "
                "reduce-scattered in fp32",
                b[2], b[0], n_params * sizeof(uint16_t), b[1]);
        return st;
    }
    if (r->zero.dev) { /* zero2 on a CUDA model: what each rank holds in device memory */
        n_params = ctrl_model_param_bytes(r->model) / sizeof(float); /* not ctrl_model_params: no copy */
        ctrl_model_grads(r->model, &n_grads);
        double v[2] = {(double)(r->zero.acc_n * sizeof(float)),
                       (double)train_zero_state_bytes(r->opt_ops, r->opt)};
        ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
        if (st == CTRL_OK && r->root)
            CTRL_INFO(
                "zero2 on the device: per rank at most %.0f bytes of gradient slices' sums (of %zu) and %.0f "
                "of optimizer state; parameters %zu bytes and the backward's gradient buffer %zu bytes, "
                "whole",
                v[0], n_grads * sizeof(float), v[1], n_params * sizeof(float), n_grads * sizeof(float));
        return st;
    }
    const float *p = ctrl_model_params(r->model, &n_params), *g = ctrl_model_grads(r->model, &n_grads);
    train_zero *z = &r->zero;
    const double state = (double)train_zero_state_bytes(r->opt_ops, r->opt);
    double v[6] = {(double)train_zero_resident(p, n_params * sizeof *p),
                   (double)train_zero_resident(g, n_grads * sizeof *g),
                   (double)z->grad_peak,
                   0,
                   0,
                   0};
    train_memory_read(&v[3], &v[4]);
    v[5] = v[0] + v[1] + (double)(z->acc_n * sizeof(float)) + state; /* this rank's, between steps */
    z->measure = 0;
    double states = state;
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 6);
    if (st == CTRL_OK) st = ctrl_collective_allreduce_sum_f64(&states, 1);
    if (st == CTRL_OK) st = train_zero_nf4_report(z); /* QLoRA: the NF4 store's slices (zero_nf4.c) */
    if (st != CTRL_OK || !r->root) return st;
    int buckets = 0;
    for (int l = 0; l < ctrl_model_cfg(r->model)->n_layers; l++) buckets += z->closes[l] != 0;
    CTRL_INFO(
        "zero%d: gradients during the backward: at most %.0f of %zu bytes resident per rank (%d buckets "
        "of layers, reduce_bucket_size = %zu floats%s); averaged slices kept: %zu bytes",
        z->stage, v[2], n_grads * sizeof *g, buckets, z->bucket,
        r->s->memory.reduce_bucket_size < 0 ? ": auto, hidden^2" : "", z->acc_n * sizeof(float));
    if (z->stage >= 3)
        CTRL_INFO("zero3: parameters resident between steps: at most %.0f of the model's %zu bytes per rank "
                  "(layers, embeddings and head %zu bytes, sliced over %d ranks); gradients: at most %.0f of "
                  "%zu bytes; %ld layer "
                  "gathers prefetched in the step (prefetch_bucket_size = %zu floats%s)",
                  v[0], n_params * sizeof *p, train_zero_layer_bytes(z), z->size, v[1], n_grads * sizeof *g,
                  z->prefetched, z->prefetch,
                  r->s->memory.prefetch_bucket_size < 0 ? ": auto, 0.9 x hidden^2" : "");
    if (z->stage >= 3) { /* the model, its gradients and the optimizer state, against one process's */
        const double whole = (double)(n_params * sizeof *p + n_grads * sizeof *g) + states;
        CTRL_INFO("zero3: per rank between steps at most %.0f bytes of parameters, gradients and optimizer "
                  "state (resident parameters and gradients, the gradient slices' sums, the state) against "
                  "%.0f unsharded: %.3f of it over %d ranks",
                  v[5], whole, whole > 0 ? v[5] / whole : 0, z->size);
    }
    if (z->stage >= 3)
        CTRL_INFO("zero3: process memory per rank at most %.0f kB now, %.0f kB at its peak (VmRSS, VmHWM)",
                  v[3], v[4]);
    if (z->stage >= 3) log_gathers(z);
    train_zero_pool_report(z); /* zero3: the gathers' and gradients' reused pages */
    return st;
}

/* offload_activations, after the first step (its last forward's layout): the bytes of layer inputs
 * in host memory and of activations on the device. */
void train_run_report_offload(const run_state *r) {
    size_t one = 0;
    const size_t host = ctrl_model_offloaded_bytes(r->model, &one),
                 dev = ctrl_model_activation_bytes(r->model);
    const int cpu = ctrl_model_device(r->model).type == CTRL_DEVICE_CPU;
    const char *where = cpu ? "a file"
                        : ctrl_model_offload_overlapped(r->model)
                            ? "page-locked host memory, copied on a side stream"
                            : "host memory";
    CTRL_INFO(
        "offload_activations: %zu bytes of layer inputs in %s; activations in %s memory: %zu bytes (%zu "
        "with every input there)",
        host, where, cpu ? "host" : "device", dev, dev + host - 2 * one);
}
