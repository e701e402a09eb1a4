/* Rotary position embeddings, rotate-half convention as in transformers: dimension i pairs with
 * i + D/2, both rotated by the angle pos * inv_freq[i]. The tables follow transformers'
 * ROPE_INIT_FUNCTIONS and are computed in float32 as they are there, so that angles at large
 * positions round the same way. */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "cpu/par_min.h"

/* inv_freq[i] = 1 / base^(2i/dim), in float32 like torch. */
static float inv_freq_at(double base, int i, int dim) {
    float e = (float)(2 * i) / (float)dim;
    return 1.0f / powf((float)base, e);
}

static float yarn_attention_factor(const ctrl_rope_params *p) {
    if (p->attention_factor > 0) return (float)p->attention_factor;
    return p->factor <= 1 ? 1.0f : (float)(0.1 * log(p->factor) + 1.0);
}

/* longrope's cos/sin scale: attention_factor, else sqrt(1 + ln(factor) / ln(original context)). */
static float longrope_attention_factor(const ctrl_rope_params *p) {
    if (p->attention_factor > 0) return (float)p->attention_factor;
    return p->factor <= 1 ? 1.0f : (float)sqrt(1 + log(p->factor) / log((double)p->original_max_position));
}

static void inv_freqs(float *inv, int dim, int max_pos, const ctrl_rope_params *p) {
    const int half = dim / 2;
    double base = p->theta;
    if (p->kind == CTRL_ROPE_DYNAMIC) {
        /* NTK-aware: a larger base once the sequence outgrows the trained context. */
        double seq = max_pos > p->original_max_position ? max_pos : p->original_max_position;
        base =
            base * pow(p->factor * seq / p->original_max_position - (p->factor - 1), (double)dim / (dim - 2));
    }
    for (int i = 0; i < half; i++) inv[i] = inv_freq_at(base, i, dim);
    if (p->kind == CTRL_ROPE_LINEAR) {
        for (int i = 0; i < half; i++) inv[i] = inv[i] / (float)p->factor;
    } else if (p->kind == CTRL_ROPE_LLAMA3) {
        const float old = (float)p->original_max_position;
        const float low_wavelen = old / (float)p->low_freq_factor,
                    high_wavelen = old / (float)p->high_freq_factor;
        for (int i = 0; i < half; i++) {
            float wavelen = (float)(2 * M_PI) / inv[i];
            float v = wavelen > low_wavelen ? inv[i] / (float)p->factor : inv[i];
            int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            if (medium) {
                float smooth = (old / wavelen - (float)p->low_freq_factor) /
                               (float)(p->high_freq_factor - p->low_freq_factor);
                v = (1 - smooth) * v / (float)p->factor + smooth * v;
            }
            inv[i] = v;
        }
    } else if (p->kind == CTRL_ROPE_LONGROPE) {
        const float *ext = p->use_long ? p->long_factor : p->short_factor;
        for (int i = 0; i < half && i < p->n_factors; i++)
            inv[i] = 1.0f / (ext[i] * powf((float)base, (float)(2 * i) / (float)dim));
    } else if (p->kind == CTRL_ROPE_YARN) {
        const double beta_fast = p->beta_fast > 0 ? p->beta_fast : 32,
                     beta_slow = p->beta_slow > 0 ? p->beta_slow : 1;
        /* The dimension at which a frequency completes `rot` rotations over the trained context. */
#define CORRECTION_DIM(rot) (dim * log(p->original_max_position / ((rot)*2 * M_PI)) / (2 * log(base)))
        double low = floor(CORRECTION_DIM(beta_fast)), high = ceil(CORRECTION_DIM(beta_slow));
#undef CORRECTION_DIM
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
            float extrap = 1.0f / pos_freq, interp = 1.0f / ((float)p->factor * pos_freq);
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extrap_factor = 1.0f - ramp;
            inv[i] = interp * (1 - extrap_factor) + extrap * extrap_factor;
        }
    }
}

void ctrl_cpu_rope_tables(float *cos_tab, float *sin_tab, int max_pos, int head_dim,
                          const ctrl_rope_params *p) {
    const int half = head_dim / 2;
    float inv[1024];
    inv_freqs(inv, head_dim, max_pos, p);
    const float scale = p->kind == CTRL_ROPE_YARN       ? yarn_attention_factor(p)
                        : p->kind == CTRL_ROPE_LONGROPE ? longrope_attention_factor(p)
                                                        : 1.0f;
#pragma omp parallel for schedule(static)
    for (int pos = 0; pos < max_pos; pos++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * inv[i];
            cos_tab[(size_t)pos * half + i] = cosf(angle) * scale;
            sin_tab[(size_t)pos * half + i] = sinf(angle) * scale;
        }
}

/* Rotates each (i, i + R/2) pair of the first R = rot_dim dimensions by sign * angle (the tables have
 * R/2 columns) and copies the others (partial rotary); backward is the rotation by -angle. */
static void rotate(float *out, const float *x, const int32_t *pos, const float *cos_tab, const float *sin_tab,
                   int T, int n_head, int head_dim, int rot_dim, float sign) {
    const int half = rot_dim / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)T * n_head * head_dim >= CTRL_CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_head; h++) {
            const float *c = cos_tab + (size_t)pos[t] * half, *s = sin_tab + (size_t)pos[t] * half;
            const float *xi = x + ((size_t)t * n_head + h) * head_dim;
            float *oi = out + ((size_t)t * n_head + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = xi[i], b = xi[i + half], si = sign * s[i];
                oi[i] = a * c[i] - b * si;
                oi[i + half] = b * c[i] + a * si;
            }
            if (oi != xi)
                for (int i = rot_dim; i < head_dim; i++) oi[i] = xi[i];
        }
}

void ctrl_cpu_rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                           const float *sin_tab, int T, int n_head, int head_dim) {
    rotate(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim, head_dim, 1.0f);
}

void ctrl_cpu_rope_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                            const float *sin_tab, int T, int n_head, int head_dim) {
    rotate(dx, dout, pos, cos_tab, sin_tab, T, n_head, head_dim, head_dim, -1.0f);
}

void ctrl_cpu_rope_partial_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                   const float *sin_tab, int T, int n_head, int head_dim, int rot_dim) {
    rotate(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim, 1.0f);
}

void ctrl_cpu_rope_partial_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                    const float *sin_tab, int T, int n_head, int head_dim, int rot_dim) {
    rotate(dx, dout, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim, -1.0f);
}
