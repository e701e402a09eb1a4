/* AdamW (decoupled weight decay), exactly as torch.optim.AdamW computes it:
 *   p <- p * (1 - lr * wd)
 *   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
 *   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * Per-group weight decay lets the core exempt norms and biases, as the HF Trainer does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_optimizer {
    double beta1, beta2, eps;
    int n_groups;
    int64_t *numel; /* per group */
    float **m, **v; /* per group, fp32, same layout as the params */
};

static void adamw_destroy(ctrl_optimizer *o) {
    if (!o) return;
    for (int g = 0; g < o->n_groups; g++) {
        if (o->m) free(o->m[g]);
        if (o->v) free(o->v[g]);
    }
    free(o->m);
    free(o->v);
    free(o->numel);
    free(o);
}

static ctrl_status adamw_create(const ctrl_host *host, const ctrl_config *cfg, const ctrl_param_group *groups,
                                int n_groups, ctrl_device device, ctrl_optimizer **out) {
    if (device.type != CTRL_DEVICE_CPU)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "optimizer adamw: only the CPU path is built so far");
    (void)host; /* kept by init (plugin_api.h) */
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
    for (int g = 0; g < n_groups; g++) {
        o->numel[g] = groups[g].numel;
        o->m[g] = calloc((size_t)groups[g].numel, sizeof(float));
        o->v[g] = calloc((size_t)groups[g].numel, sizeof(float));
        if (!o->m[g] || !o->v[g]) goto oom;
    }
    *out = o;
    return CTRL_OK;
oom:
    adamw_destroy(o);
    return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer adamw: out of memory for the state");
}

static ctrl_status adamw_step(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups, double lr,
                              int64_t step) {
    if (n_groups != o->n_groups || step < 1)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer adamw: step %lld with %d groups (created with %d)",
                              (long long)step, n_groups, o->n_groups);
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
    const double bc1 = 1.0 - pow(o->beta1, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, (double)step));
    for (int g = 0; g < n_groups; g++) {
        if (groups[g].numel != o->numel[g])
            return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer adamw: group %d changed size", g);
        float *p = groups[g].param, *m = o->m[g], *v = o->v[g];
        const float *grad = groups[g].grad;
        const float decay = (float)(1.0 - lr * groups[g].weight_decay);
        const int64_t n = groups[g].numel;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gi = grad[i];
            p[i] *= decay;
            m[i] = b1 * m[i] + (1.0f - b1) * gi;
            v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
            float denom = sqrtf(v[i]) / bc2_sqrt + eps;
            p[i] -= step_size * m[i] / denom;
        }
    }
    return CTRL_OK;
}

static int adamw_state_count(const ctrl_optimizer *o) { return 2 * o->n_groups; }

static ctrl_status adamw_state_get(ctrl_optimizer *o, int i, const char **name, float **data,
                                   int64_t *numel) {
    if (i < 0 || i >= 2 * o->n_groups)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer adamw: no state buffer %d", i);
    int g = i / 2;
    *name = (i % 2) ? "exp_avg_sq" : "exp_avg";
    *data = (i % 2) ? o->v[g] : o->m[g];
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
};

static const ctrl_option adamw_options[] = {
    {.key = "adam_beta1",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0.9",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN,
     .min = 0,
     .max = 1,
     .doc = "Decay rate of the first-moment estimate."},
    {.key = "adam_beta2",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0.999",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN,
     .min = 0,
     .max = 1,
     .doc = "Decay rate of the second-moment estimate."},
    {.key = "adam_epsilon",
     .type = CTRL_OPT_FLOAT,
     .default_value = "1e-8",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN,
     .min = 0,
     .doc = "Added to the denominator for numerical stability."},
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
