/* Random initialisation as transformers' _init_weights does for these models: linear and
 * embedding weights ~ N(0, initializer_range), biases 0, RMSNorm weights 1 (Gemma's, which scale by
 * 1 + weight, 0). Deterministic in the
 * seed (splitmix64 + Box-Muller), independent of the thread count. */
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "model/model_internal.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* N(0, std) values, one stream per tensor (its view index). */
static void normal_fill(float *x, int64_t n, uint64_t seed, int view, float std) {
    uint64_t s = seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(view + 1));
    for (int64_t k = 0; k < n; k += 2) {
        double u1 = uniform01(&s), u2 = uniform01(&s), r = sqrt(-2.0 * log(u1));
        x[k] = (float)(std * r * cos(2 * M_PI * u2));
        if (k + 1 < n) x[k + 1] = (float)(std * r * sin(2 * M_PI * u2));
    }
}

void ctrl_model_init_random(ctrl_model *m, uint64_t seed, float std) {
    float *p = ctrl_model_params(m, NULL);
    for (int i = 0; i < ctrl_model_view_count(m); i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        float *x = p + v->offset;
        const char *name = v->name;
        size_t len = strlen(name);
        int is_bias = len > 5 && !strcmp(name + len - 5, ".bias");
        int is_norm = strstr(name, "norm") != NULL;
        if (is_norm) {
            const float one = ctrl_model_cfg(m)->norm_plus_one ? 0.0f : 1.0f;
            for (int64_t k = 0; k < v->numel; k++) x[k] = one;
        } else if (is_bias) {
            memset(x, 0, sizeof(float) * (size_t)v->numel);
        } else {
            normal_fill(x, v->numel, seed, i, std);
        }
    }
    lora_tokens_capture(m, -1);    /* trainable_token_indices' rows: the tables' new ones */
    lora_saved_capture(m, -1);     /* modules_to_save's base values */
    ctrl_model_weights_changed(m); /* a model on a device copies them there before its next forward */
}

void ctrl_model_init_view(ctrl_model *m, int i, uint64_t seed, float std) {
    const ctrl_param_view *v = ctrl_model_view(m, i);
    if (!v) return;
    normal_fill(ctrl_model_params(m, NULL) + v->offset, v->numel, seed, i, std);
    ctrl_model_weights_changed(m);
}
