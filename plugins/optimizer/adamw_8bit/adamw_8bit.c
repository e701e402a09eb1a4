/* 8-bit AdamW as bitsandbytes defines it (bnb.optim.AdamW8bit; transformers' optim="adamw_bnb_8bit"):
 * both moments stored in 8 bits with blockwise dynamic quantization (blockwise8.h: blocks of 256,
 * the signed dynamic map for exp_avg, the unsigned one for exp_avg_sq, each block's absmax in fp32),
 * 2 bytes a parameter of state instead of AdamW's 8. Each step, per block: dequantize, update,
 * requantize with the block's new absmax -- the arithmetic of bitsandbytes' CPU kernel
 * (backends/cpu/ops.py, _optimizer_update_8bit_blockwise_cpu), rounded as torch's CPU ops round it
 * (the two moment updates each a fused multiply-add, the rest one operation at a time):
 *   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
 *   p <- p (1 - lr wd);  p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * A tensor below min_8bit_size keeps fp32 moments and bitsandbytes' 32-bit update
 *   p <- p (1 - lr wd);  p <- p - lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps sqrt(1 - b2^t)).
 * Host only: on a device the core steps it on the host (create says CTRL_ERR_UNSUPPORTED). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>
#include <ctrl/plugin_api.h>

#include "blockwise8.h"

CTRL_PLUGIN_API_DEFINE;

#define NAME "adamw_8bit"

typedef struct group_state {
    int64_t numel, blocks;
    uint8_t *q1, *q2;         /* 8-bit: the moments' map indices */
    float *absmax1, *absmax2; /* 8-bit: per block */
    float *m, *v;             /* below min_8bit_size: fp32 moments */
} group_state;

struct ctrl_optimizer {
    double beta1, beta2, eps;
    int64_t min_8bit_size;
    int n_groups;
    group_state *gs;
    float map1[256], map2[256];           /* signed (exp_avg), unsigned (exp_avg_sq) */
    uint8_t lut1[BW8_LUT], lut2[BW8_LUT]; /* their quantization tables */
};

static void adamw8_destroy(ctrl_optimizer *o) {
    if (!o) return;
    for (int g = 0; o->gs && g < o->n_groups; g++) {
        group_state *s = &o->gs[g];
        free(s->q1), free(s->q2), free(s->absmax1), free(s->absmax2), free(s->m), free(s->v);
    }
    free(o->gs);
    free(o);
}

static ctrl_status adamw8_create(const ctrl_host *host, const ctrl_config *cfg,
                                 const ctrl_param_group *groups, int n_groups, ctrl_device device,
                                 ctrl_optimizer **out) {
    (void)host;
    if (device.type != CTRL_DEVICE_CPU)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "optimizer " NAME ": no device kernel (steps on the host)");
    ctrl_optimizer *o = calloc(1, sizeof *o);
    if (!o) return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer " NAME ": out of memory");
    ctrl_status st = CTRL_OK;
    o->beta1 = ctrl_option_float(cfg, NAME, "adam_beta1", &st);
    o->beta2 = ctrl_option_float(cfg, NAME, "adam_beta2", &st);
    o->eps = ctrl_option_float(cfg, NAME, "adam_epsilon", &st);
    o->min_8bit_size = ctrl_option_int(cfg, NAME, "min_8bit_size", &st);
    if (st != CTRL_OK) {
        free(o);
        return st;
    }
    bw8_dynamic_map(1, o->map1);
    bw8_dynamic_map(0, o->map2);
    bw8_build_lut(o->map1, o->lut1);
    bw8_build_lut(o->map2, o->lut2);
    o->n_groups = n_groups;
    o->gs = calloc((size_t)(n_groups ? n_groups : 1), sizeof *o->gs);
    if (!o->gs) goto oom;
    for (int g = 0; g < n_groups; g++) {
        group_state *s = &o->gs[g];
        const size_t n = (size_t)groups[g].numel;
        s->numel = groups[g].numel;
        if (s->numel < o->min_8bit_size) { /* bitsandbytes keeps small tensors' state in fp32 */
            s->m = calloc(n ? n : 1, sizeof(float));
            s->v = calloc(n ? n : 1, sizeof(float));
            if (!s->m || !s->v) goto oom;
            continue;
        }
        s->blocks = (s->numel + BW8_BLOCK - 1) / BW8_BLOCK;
        s->q1 = ctrl_calloc_huge(n, 1), s->q2 = ctrl_calloc_huge(n, 1);
        s->absmax1 = calloc((size_t)s->blocks, sizeof(float));
        s->absmax2 = calloc((size_t)s->blocks, sizeof(float));
        if (!s->q1 || !s->q2 || !s->absmax1 || !s->absmax2) goto oom;
    }
    *out = o;
    return CTRL_OK;
oom:
    adamw8_destroy(o);
    return ctrl_error_set(CTRL_ERR_NOMEM, "optimizer " NAME ": out of memory for the state");
}

typedef struct step_consts {
    float b1, a1, b2, a2, eps, decay, corr2, step_size; /* as bitsandbytes rounds them to fp32 */
    int decays;
} step_consts;

/* One block of an 8-bit group: dequantize, update (parameters too), requantize. The update is one
 * vectorised loop (each element's arithmetic exactly as written: no contraction, no reassociation). */
static void step_block(const ctrl_optimizer *o, const step_consts *c, group_state *s, float *p,
                       const float *grad, int64_t b) {
    const int64_t lo = b * BW8_BLOCK;
    const int n = (int)(s->numel - lo < BW8_BLOCK ? s->numel - lo : BW8_BLOCK);
    float m[BW8_BLOCK], v[BW8_BLOCK];
    uint8_t *q1 = s->q1 + lo, *q2 = s->q2 + lo;
    const float a1 = s->absmax1[b], a2 = s->absmax2[b];
    for (int i = 0; i < n; i++) m[i] = o->map1[q1[i]] * a1, v[i] = o->map2[q2[i]] * a2;
    const float b1 = c->b1, c1 = c->a1, b2 = c->b2, c2 = c->a2, eps = c->eps, corr2 = c->corr2,
                step_size = c->step_size, decay = c->decays ? c->decay : 1.0f;
    float *pp = p + lo;
    const float *gg = grad + lo;
#pragma omp simd
    for (int i = 0; i < n; i++) {
        const float g = gg[i];
        m[i] = fmaf(c1, g, m[i] * b1);
        v[i] = fmaf(c2 * g, g, v[i] * b2);
        const float pi = pp[i] * decay; /* 1.0f without weight decay: the same value */
        pp[i] = pi + step_size * (m[i] / (sqrtf(v[i]) / corr2 + eps));
    }
    bw8_quantize_block(o->lut1, m, n, q1, &s->absmax1[b]);
    bw8_quantize_block(o->lut2, v, n, q2, &s->absmax2[b]);
}

static ctrl_status adamw8_step(ctrl_optimizer *o, const ctrl_param_group *groups, int n_groups, double lr,
                               int64_t step) {
    if (n_groups != o->n_groups || step < 1)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "optimizer " NAME ": step %lld with %d groups (created with %d)",
                              (long long)step, n_groups, o->n_groups);
    const double corr1 = 1.0 - pow(o->beta1, (double)step), corr2 = sqrt(1.0 - pow(o->beta2, (double)step));
    for (int g = 0; g < n_groups; g++) {
        group_state *s = &o->gs[g];
        if (groups[g].numel != s->numel)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer " NAME ": group %d changed size", g);
        const double wd = groups[g].weight_decay;
        step_consts c = {.b1 = (float)o->beta1,
                         .a1 = (float)(1.0 - o->beta1),
                         .b2 = (float)o->beta2,
                         .a2 = (float)(1.0 - o->beta2),
                         .decay = (float)(1.0 - lr * wd),
                         .decays = wd > 0.0};
        float *p = groups[g].param;
        const float *grad = groups[g].grad;
        if (s->q1) {
            c.eps = (float)o->eps, c.corr2 = (float)corr2, c.step_size = (float)(-lr / corr1);
#pragma omp parallel for schedule(static)
            for (int64_t b = 0; b < s->blocks; b++) step_block(o, &c, s, p, grad, b);
            continue;
        }
        /* fp32 state: bitsandbytes' 32-bit CPU update */
        const float eps_c2 = (float)(o->eps * corr2), step_size = (float)(-lr * corr2 / corr1);
        for (int64_t i = 0; i < s->numel; i++) {
            const float gi = grad[i];
            s->m[i] = fmaf(c.a1, gi, s->m[i] * c.b1);
            s->v[i] = fmaf(c.a2 * gi, gi, s->v[i] * c.b2);
            float pi = p[i];
            if (c.decays) pi *= c.decay;
            p[i] = fmaf(step_size, s->m[i] / (sqrtf(s->v[i]) + eps_c2), pi);
        }
    }
    return CTRL_OK;
}

/* The state, per group as bitsandbytes names it: state1, state2 (8-bit indices or fp32 moments)
 * and, for an 8-bit group, absmax1, absmax2. */
static int group_buffers(const group_state *s) { return s->q1 ? 4 : 2; }

static int adamw8_state_count(const ctrl_optimizer *o) {
    int n = 0;
    for (int g = 0; g < o->n_groups; g++) n += group_buffers(&o->gs[g]);
    return n;
}

/* The group and the buffer within it of state index i; -1 when out of range. */
static int locate(const ctrl_optimizer *o, int i, int *k) {
    for (int g = 0; g < o->n_groups && i >= 0; g++) {
        if (i < group_buffers(&o->gs[g])) {
            *k = i;
            return g;
        }
        i -= group_buffers(&o->gs[g]);
    }
    return -1;
}

static ctrl_dtype adamw8_state_dtype(const ctrl_optimizer *o, int i) {
    int k;
    const int g = locate(o, i, &k);
    return g >= 0 && o->gs[g].q1 && k < 2 ? CTRL_U8 : CTRL_F32;
}

static ctrl_status adamw8_state_get(ctrl_optimizer *o, int i, const char **name, float **data,
                                    int64_t *numel) {
    int k;
    const int g = locate(o, i, &k);
    if (g < 0) return ctrl_error_set(CTRL_ERR_RUNTIME, "optimizer " NAME ": no state buffer %d", i);
    static const char *const names[4] = {"state1", "state2", "absmax1", "absmax2"};
    group_state *s = &o->gs[g];
    *name = names[k];
    *numel = k < 2 ? s->numel : s->blocks;
    if (!s->q1)
        *data = k ? s->v : s->m;
    else
        *data = k == 0   ? (float *)(void *)s->q1
                : k == 1 ? (float *)(void *)s->q2
                : k == 2 ? s->absmax1
                         : s->absmax2;
    return CTRL_OK;
}

static const ctrl_optimizer_ops adamw8_ops = {
    .size = sizeof(ctrl_optimizer_ops),
    .create = adamw8_create,
    .step = adamw8_step,
    .state_count = adamw8_state_count,
    .state_get = adamw8_state_get,
    .destroy = adamw8_destroy,
    .state_dtype = adamw8_state_dtype,
};

static const ctrl_option adamw8_options[] = {
    CTRL_ADAM_OPTIONS,
    {.key = "min_8bit_size",
     .type = CTRL_OPT_INT,
     .default_value = "4096",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "Tensors (parameter groups) with fewer elements keep fp32 moments, as bitsandbytes' "
            "min_8bit_size."},
    CTRL_OPTION_END,
};

static const ctrl_plugin adamw8_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_OPTIMIZER,
    .name = NAME,
    .version = "0.1.0",
    .summary = "8-bit AdamW: moments in blockwise dynamic 8-bit quantization (bitsandbytes' AdamW8bit)",
    .options = adamw8_options,
    .init = ctrl_plugin_api_init,
    .ops = &adamw8_ops,
};

CTRL_PLUGIN_DEFINE(&adamw8_plugin)
