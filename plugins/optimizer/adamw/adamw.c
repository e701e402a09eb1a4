/* AdamW (decoupled weight decay), exactly as torch.optim.AdamW computes it:
 *   p <- p * (1 - lr * wd)
 *   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
 *   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * Per-group weight decay lets the core exempt norms and biases, as the HF Trainer does. On a device
 * (a CUDA run) the state lives there and each group is one launch of the device's fused AdamW
 * kernel (host->device_kernels), the same formula. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>
#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_optimizer {
    double beta1, beta2, eps;
    int n_groups;
    int64_t *numel; /* per group */
    float **m, **v; /* per group, fp32, same layout as the params: host memory, or the device's */
    /* On a device (create's device is not the CPU): its kernels, the two state buffers the groups'
     * m and v point into, and their host copies for checkpoints (state_get, state_sync). */
    const ctrl_device_kernels *dev;
    float *dev_m, *dev_v, *host_m, *host_v;
    int64_t total;
};

static void adamw_destroy(ctrl_optimizer *o) {
    if (!o) return;
    for (int g = 0; g < o->n_groups && !o->dev; g++) {
        if (o->m) free(o->m[g]);
        if (o->v) free(o->v[g]);
    }
    if (o->dev) o->dev->free(o->dev_m), o->dev->free(o->dev_v);
    free(o->host_m);
    free(o->host_v);
    free(o->m);
    free(o->v);
    free(o->numel);
    free(o);
}

/* The state on the device: one zeroed buffer each for exp_avg and exp_avg_sq, the groups' parts
 * consecutive in them. */
static ctrl_status device_state(ctrl_optimizer *o) {
    for (int g = 0; g < o->n_groups; g++) o->total += o->numel[g];
    const size_t bytes = (size_t)o->total * sizeof(float);
    ctrl_status st = o->dev->alloc((void **)&o->dev_m, bytes);
    if (st == CTRL_OK) st = o->dev->alloc((void **)&o->dev_v, bytes);
    if (st == CTRL_OK) st = o->dev->fill_zero(o->dev_m, bytes);
    if (st == CTRL_OK) st = o->dev->fill_zero(o->dev_v, bytes);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st, "optimizer adamw: %zu bytes of state on the device", 2 * bytes);
    int64_t off = 0;
    for (int g = 0; g < o->n_groups; off += o->numel[g], g++)
        o->m[g] = o->dev_m + off, o->v[g] = o->dev_v + off;
    return CTRL_OK;
}

static ctrl_status adamw_create(const ctrl_host *host, const ctrl_config *cfg, const ctrl_param_group *groups,
                                int n_groups, ctrl_device device, ctrl_optimizer **out) {
    const ctrl_device_kernels *dev = NULL;
    if (device.type != CTRL_DEVICE_CPU) {
        dev = host->size >= offsetof(ctrl_host, device_kernels) + sizeof host->device_kernels &&
                      host->device_kernels
                  ? host->device_kernels(device)
                  : NULL;
        if (!dev || dev->size < offsetof(ctrl_device_kernels, adamw_step) + sizeof dev->adamw_step)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "optimizer adamw: no AdamW kernel on this device");
    }
    ctrl_optimizer *o = calloc(1, sizeof *o);
    if (!o) return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer adamw: out of memory");
    ctrl_status st = CTRL_OK;
    o->beta1 = ctrl_option_float(cfg, "adamw", "adam_beta1", &st);
    o->beta2 = ctrl_option_float(cfg, "adamw", "adam_beta2", &st);
    o->eps = ctrl_option_float(cfg, "adamw", "adam_epsilon", &st);
    if (st != CTRL_OK) {
        free(o);
        return st;
    }
    o->n_groups = n_groups;
    o->numel = calloc((size_t)n_groups, sizeof *o->numel);
    o->m = calloc((size_t)n_groups, sizeof *o->m);
    o->v = calloc((size_t)n_groups, sizeof *o->v);
    if (!o->numel || !o->m || !o->v) goto oom;
    for (int g = 0; g < n_groups; g++) o->numel[g] = groups[g].numel;
    if (dev) {
        o->dev = dev;
        if ((st = device_state(o)) != CTRL_OK) {
            adamw_destroy(o);
            return st;
        }
        *out = o;
        return CTRL_OK;
    }
    for (int g = 0; g < n_groups; g++) {
        o->m[g] = ctrl_calloc_huge((size_t)groups[g].numel, sizeof(float));
        o->v[g] = ctrl_calloc_huge((size_t)groups[g].numel, sizeof(float));
        if (!o->m[g] || !o->v[g]) goto oom;
    }
    *out = o;
    return CTRL_OK;
oom:
    adamw_destroy(o);
    return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer adamw: out of memory for the state");
}

/* One group's update over [0, n): the formula above, each gradient multiplied by `scale` first
 * (global-norm clipping, fused: exactly what the core's own pass x[i] *= scale would have stored).
 * The operations and their order are the scalar loop's; `omp simd` with restrict pointers lets the
 * compiler run it 16 lanes wide (the plugin is built with -fno-math-errno so that sqrtf is the
 * vector instruction, correctly rounded as the scalar one: the results are bit for bit the same).
 * Scalar, the two divisions and the square root made the update compute-bound at 494M parameters
 * (1.3 CPU s a step); vectorised it runs at memory speed. */
static void adamw_span(float *restrict p, float *restrict m, float *restrict v, const float *restrict grad,
                       int64_t n, float scale, float decay, float b1, float b2, float eps, float step_size,
                       float bc2_sqrt) {
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float gi = grad[i] * scale;
        const float pi = p[i] * decay;
        const float mi = b1 * m[i] + c1 * gi;
        const float vi = b2 * v[i] + c2 * gi * gi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi, v[i] = vi;
        p[i] = pi - step_size * mi / denom;
    }
}

/* Blocks of this many parameters are the threads' unit of work (whole cache lines, 64 KiB of each
 * of p, m, v and the gradient). */
#define ADAMW_BLOCK 16384

/* The update of groups [g0, g1) of the n_groups (every group: 0, n_groups). */
static ctrl_status adamw_update(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups, double lr,
                                int64_t step, float scale, int g0, int g1) {
    if (n_groups != o->n_groups || step < 1 || g0 < 0 || g1 > n_groups || g0 > g1)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "optimizer adamw: step %lld of groups [%d, %d) of %d (created with %d)",
                              (long long)step, g0, g1, n_groups, o->n_groups);
    if (o->dev && scale != 1.0f) /* the core scales device gradients itself (it never asks this) */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "optimizer adamw: a fused gradient scale on a device");
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
    const double bc1 = 1.0 - pow(o->beta1, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, (double)step));
    for (int g = g0; g < g1; g++)
        if (groups[g].numel != o->numel[g])
            return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer adamw: group %d changed size", g);
    if (o->dev) {
        for (int g = g0; g < g1; g++) { /* the fused kernel: the same formula, on the device */
            ctrl_status st =
                o->dev->adamw_step(groups[g].param, groups[g].grad, o->m[g], o->v[g], groups[g].numel,
                                   (float)lr, b1, b2, eps, groups[g].weight_decay, step);
            if (st != CTRL_OK) return st;
        }
        return CTRL_OK;
    }
    /* every group's blocks in one parallel loop (a model has hundreds of groups, many small: one
     * fork per group would leave threads idle on the norms and biases) */
    int64_t nb = 0;
    for (int g = g0; g < g1; g++) nb += (groups[g].numel + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel
    {
        int g = g0;
        int64_t before = 0; /* blocks of the groups before g */
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            while (b >= before + (groups[g].numel + ADAMW_BLOCK - 1) / ADAMW_BLOCK)
                before += (groups[g].numel + ADAMW_BLOCK - 1) / ADAMW_BLOCK, g++;
            const int64_t i0 = (b - before) * ADAMW_BLOCK, n = groups[g].numel - i0;
            const float decay = (float)(1.0 - lr * groups[g].weight_decay);
            adamw_span(groups[g].param + i0, o->m[g] + i0, o->v[g] + i0, groups[g].grad + i0,
                       n < ADAMW_BLOCK ? n : ADAMW_BLOCK, scale, decay, b1, b2, eps, step_size, bc2_sqrt);
        }
    }
    return CTRL_OK;
}

static ctrl_status adamw_step(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups, double lr,
                              int64_t step) {
    return adamw_update(o, groups, n_groups, lr, step, 1.0f, 0, n_groups);
}

static ctrl_status adamw_step_scaled(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups,
                                     double lr, int64_t step, float grad_scale) {
    return adamw_update(o, groups, n_groups, lr, step, grad_scale, 0, n_groups);
}

static ctrl_status adamw_step_groups(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups,
                                     double lr, int64_t step, int g0, int g1) {
    return adamw_update(o, groups, n_groups, lr, step, 1.0f, g0, g1);
}

static int adamw_state_count(const ctrl_optimizer *o) { return 2 * o->n_groups; }

/* On a device: the host copies of the state, made on first use. */
static ctrl_status host_copies(ctrl_optimizer *o) {
    if (!o->host_m) o->host_m = malloc((size_t)o->total * sizeof(float));
    if (!o->host_v) o->host_v = malloc((size_t)o->total * sizeof(float));
    return o->host_m && o->host_v
               ? CTRL_OK
               : ctrl_error_set(CTRL_ERR_NOMEM, "optimizer adamw: out of memory for the state");
}

static ctrl_status adamw_state_sync(ctrl_optimizer *o, int to_device) {
    if (!o->dev) return CTRL_OK;
    ctrl_status st = host_copies(o);
    const size_t bytes = (size_t)o->total * sizeof(float);
    if (st == CTRL_OK)
        st = to_device ? o->dev->to_device(o->dev_m, o->host_m, bytes)
                       : o->dev->to_host(o->host_m, o->dev_m, bytes);
    if (st == CTRL_OK)
        st = to_device ? o->dev->to_device(o->dev_v, o->host_v, bytes)
                       : o->dev->to_host(o->host_v, o->dev_v, bytes);
    return st;
}

static ctrl_status adamw_state_get(ctrl_optimizer *o, int i, const char **name, float **data,
                                   int64_t *numel) {
    if (i < 0 || i >= 2 * o->n_groups)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer adamw: no state buffer %d", i);
    int g = i / 2;
    *name = (i % 2) ? "exp_avg_sq" : "exp_avg";
    *data = (i % 2) ? o->v[g] : o->m[g];
    if (o->dev) { /* the host copy of the group's part (state_sync moves it) */
        ctrl_status st = host_copies(o);
        if (st != CTRL_OK) return st;
        *data = ((i % 2) ? o->host_v : o->host_m) + ((i % 2) ? o->v[g] - o->dev_v : o->m[g] - o->dev_m);
    }
    *numel = o->numel[g];
    return CTRL_OK;
}

static const ctrl_optimizer_ops adamw_ops = {
    .size = sizeof(ctrl_optimizer_ops),
    .create = adamw_create,
    .step = adamw_step,
    .state_count = adamw_state_count,
    .state_get = adamw_state_get,
    .destroy = adamw_destroy,
    .state_sync = adamw_state_sync,
    .step_scaled = adamw_step_scaled,
    .step_groups = adamw_step_groups,
};

static const ctrl_option adamw_options[] = {
    CTRL_ADAM_OPTIONS,
    CTRL_OPTION_END,
};

static const ctrl_plugin adamw_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_OPTIMIZER,
    .name = "adamw",
    .version = "0.1.0",
    .summary = "AdamW with decoupled weight decay (torch.optim.AdamW semantics)",
    .options = adamw_options,
    .init = ctrl_plugin_api_init,
    .ops = &adamw_ops,
};

CTRL_PLUGIN_DEFINE(&adamw_plugin)
