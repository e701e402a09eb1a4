/* SGD with momentum, dampening and Nesterov, exactly as torch.optim.SGD computes it:
 *   g <- g + wd * p                       (L2 weight decay, coupled, as torch does for SGD)
 *   b <- g (first step) | mu b + (1 - dampening) g
 *   g <- g + mu b (nesterov) | b
 *   p <- p - lr g                                                                            */
#include <stdlib.h>

#include <ctrl/hugepages.h>
#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_optimizer {
    double momentum, dampening;
    int nesterov;
    int n_groups;
    int64_t *numel;
    float **buf; /* momentum buffers (NULL when momentum == 0) */
};

static void sgd_destroy(ctrl_optimizer *o) {
    if (!o) return;
    for (int g = 0; g < o->n_groups && o->buf; g++) free(o->buf[g]);
    free(o->buf);
    free(o->numel);
    free(o);
}

/* The options into o, checked (create, and check_options when the config is validated). */
static ctrl_status read_options(const ctrl_config *cfg, ctrl_optimizer *o) {
    ctrl_status st = CTRL_OK;
    o->momentum = ctrl_option_float(cfg, "sgd", "momentum", &st);
    o->dampening = ctrl_option_float(cfg, "sgd", "dampening", &st);
    o->nesterov = ctrl_option_bool(cfg, "sgd", "nesterov", &st);
    if (st == CTRL_OK && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        st = ctrl_error_set(CTRL_ERR_CONFIG, "[sgd] nesterov = true needs momentum > 0 and dampening = 0");
    return st;
}

static ctrl_status sgd_check_options(const ctrl_config *cfg, const char *section) {
    (void)section;
    ctrl_optimizer o = {0};
    return read_options(cfg, &o);
}

static ctrl_status sgd_create(const ctrl_host *host, const ctrl_config *cfg, const ctrl_param_group *groups,
                              int n_groups, ctrl_device device, ctrl_optimizer **out) {
    if (device.type != CTRL_DEVICE_CPU)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "optimizer sgd: only the CPU path is built so far");
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_optimizer *o = calloc(1, sizeof *o);
    if (!o) return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer sgd: out of memory");
    ctrl_status st = read_options(cfg, o);
    if (st != CTRL_OK) {
        sgd_destroy(o);
        return st;
    }
    o->n_groups = n_groups;
    o->numel = calloc((size_t)n_groups, sizeof *o->numel);
    o->buf = calloc((size_t)n_groups, sizeof *o->buf);
    if (!o->numel || !o->buf) goto oom;
    for (int g = 0; g < n_groups; g++) {
        o->numel[g] = groups[g].numel;
        if (o->momentum != 0 && !(o->buf[g] = ctrl_calloc_huge((size_t)groups[g].numel, sizeof(float))))
            goto oom;
    }
    *out = o;
    return CTRL_OK;
oom:
    sgd_destroy(o);
    return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer sgd: out of memory for the state");
}

static ctrl_status sgd_step(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups, double lr,
                            int64_t step) {
    if (n_groups != o->n_groups || step < 1)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer sgd: step %lld with %d groups (created with %d)",
                              (long long)step, n_groups, o->n_groups);
    const float mu = (float)o->momentum, damp = (float)o->dampening, flr = (float)lr;
    for (int g = 0; g < n_groups; g++) {
        if (groups[g].numel != o->numel[g])
            return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer sgd: group %d changed size", g);
        float *p = groups[g].param, *b = o->buf[g];
        const float *grad = groups[g].grad;
        const float wd = groups[g].weight_decay;
        const int64_t n = groups[g].numel;
        const int first = step == 1;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = grad[i];
            if (wd != 0) d += wd * p[i];
            if (b) {
                b[i] = first ? d : mu * b[i] + (1.0f - damp) * d;
                d = o->nesterov ? d + mu * b[i] : b[i];
            }
            p[i] -= flr * d;
        }
    }
    return CTRL_OK;
}

static int sgd_state_count(const ctrl_optimizer *o) { return o->momentum != 0 ? o->n_groups : 0; }

static ctrl_status sgd_state_get(ctrl_optimizer *o, int i, const char **name, float **data, int64_t *numel) {
    if (i < 0 || i >= sgd_state_count(o))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer sgd: no state buffer %d", i);
    *name = "momentum_buffer";
    *data = o->buf[i];
    *numel = o->numel[i];
    return CTRL_OK;
}

static const ctrl_optimizer_ops sgd_ops = {
    .size = sizeof(ctrl_optimizer_ops),
    .create = sgd_create,
    .step = sgd_step,
    .state_count = sgd_state_count,
    .state_get = sgd_state_get,
    .destroy = sgd_destroy,
};

static const ctrl_option sgd_options[] = {
    {.key = "momentum",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "Momentum factor (0 = plain SGD)."},
    {.key = "dampening",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX,
     .min = 0,
     .max = 1,
     .doc = "Dampening of the momentum update."},
    {.key = "nesterov",
     .type = CTRL_OPT_BOOL,
     .default_value = "false",
     .doc = "Nesterov momentum (needs momentum > 0 and dampening = 0)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin sgd_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_OPTIMIZER,
    .name = "sgd",
    .version = "0.1.0",
    .summary = "SGD with momentum and Nesterov (torch.optim.SGD semantics)",
    .options = sgd_options,
    .init = ctrl_plugin_api_init,
    .ops = &sgd_ops,
    .check_options = sgd_check_options,
};

CTRL_PLUGIN_DEFINE(&sgd_plugin)
