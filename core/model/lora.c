/* LoRA adapters in the model (see lora.h): their layout after the base, PEFT's initialisations,
 * and the adapter's share of a linear layer's forward and backward, every op through the backend
 * ops table as the rest of the model:
 *   forward   xa = s * (dropout(x) A^T)   (kept for backward)       out += xa B^T
 *   backward  dB += dout^T xa;  dxa = s * (dout B);  dA += dxa^T dropout(x);  dx += dropout'(dxa A)
 * Dropout (training mode only) draws its mask from a hash of (seed, forward counter, layer,
 * target, element), so that a layer a memory strategy recomputes gets the same mask again and the
 * backward needs no stored mask; the hash is counter-based (splitmix64's finalizer of key + i * the
 * golden ratio), so a device draws the host's mask element by element where the values are
 * (kernels/cuda/lora.cu, the backend's lora_dropout op): no host round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

const char *const ctrl_lora_target_names[LORA_N_TARGETS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
const char *const ctrl_lora_module_names[LORA_N_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",   "self_attn.o_proj", "mlp.gate_proj",
    "mlp.up_proj",      "mlp.down_proj",    "self_attn.qkv_proj", "mlp.gate_up_proj"};

float ctrl_lora_scaling(const ctrl_lora_config *c) {
    return c->use_rslora ? c->lora_alpha / sqrtf((float)c->r) : c->lora_alpha / (float)c->r;
}

static long *a_off(const ctrl_model *m, int l, int t) { return &m->lora_a[l * LORA_N_TARGETS + t]; }
static long *b_off(const ctrl_model *m, int l, int t) { return &m->lora_b[l * LORA_N_TARGETS + t]; }
int lora_r(const ctrl_model *m, int l, int t) { return m->lora_rank[l * LORA_N_TARGETS + t]; }
float lora_s(const ctrl_model *m, int l, int t) { return m->lora_scales[l * LORA_N_TARGETS + t]; }

void lora_dims(const ctrl_model *m, int t, int *in, int *out) {
    const ctrl_model_config *c = &m->cfg;
    const int C = c->hidden_size, I = c->intermediate_size, QD = c->n_heads * c->head_dim,
              KD = c->n_kv_heads * c->head_dim;
    static const int kv[LORA_N_TARGETS] = {0, 1, 1, 0, 0, 0, 0};
    *in = t == LORA_O ? QD : t == LORA_DOWN ? I : C;
    *out = t == LORA_Q ? QD : kv[t] ? KD : t == LORA_O || t == LORA_DOWN ? C : I;
}

int lora_module(const ctrl_model *m, int t, int *row0, int *module_out) {
    const ctrl_model_config *c = &m->cfg;
    const int QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim, I = c->intermediate_size;
    int in;
    lora_dims(m, t, &in, module_out);
    *row0 = 0;
    if (c->fused_qkv && t <= LORA_V) { /* q's rows, then k's, then v's (Phi3Attention's split) */
        *row0 = t == LORA_Q ? 0 : t == LORA_K ? QD : QD + KD, *module_out = QD + 2 * KD;
        return LORA_QKV;
    }
    if (c->fused_gate_up && (t == LORA_GATE || t == LORA_UP)) { /* Phi3MLP's chunk(2): gate, then up */
        *row0 = t == LORA_GATE ? 0 : I, *module_out = 2 * I;
        return LORA_GATE_UP;
    }
    return t;
}

/* What PEFT 0.21 computes differently on a mixture-of-experts model, or refuses, refused by key:
 * gate_proj / up_proj / down_proj or all-linear in target_modules (PEFT converts them on the MoE
 * families into target_parameters with the router's gate.weight and a doubled rank on gate_up_proj,
 * leaving a dense layer's MLP without adapters), lora_dropout and DoRA with target_parameters (PEFT's
 * ParamWrapper refuses both). */
static ctrl_status lora_check_moe(const ctrl_model *m) {
    const ctrl_lora_config *c = m->lora;
    if (c->n_params > 0 && c->lora_dropout > 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: lora_dropout = %g with target_parameters: PEFT's "
                              "ParamWrapper (LoRA on expert weights) needs lora_dropout = 0",
                              (double)c->lora_dropout);
    if (c->n_params > 0 && c->use_dora)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: use_dora with target_parameters: PEFT's ParamWrapper has no DoRA");
    for (int l = 0; m->cfg.n_experts > 0 && l < m->cfg.n_layers; l++)
        for (int t = LORA_GATE; t <= LORA_DOWN; t++) {
            const int on = ctrl_lora_targets(c, l, t);
            if (on < 0) return CTRL_ERR_CONFIG;
            if (on)
                return ctrl_error_set(
                    CTRL_ERR_UNSUPPORTED,
                    "LoRA: target_modules %s on %s, a mixture-of-experts model: PEFT 0.21 turns these into "
                    "target_parameters with the router's gate.weight and rank 2 r on gate_up_proj "
                    "(rank_pattern), which is not implemented; name the attention projections in "
                    "target_modules and experts.gate_up_proj / experts.down_proj in target_parameters",
                    c->all_linear ? "all-linear" : ctrl_lora_target_names[t], m->cfg.model_type);
        }
    return CTRL_OK;
}

ctrl_status lora_layout(ctrl_model *m, size_t *cursor) {
    char n[160];
    int adapted = 0, wrapped = 0;
    MODEL_TRY(lora_check_moe(m));
    MODEL_TRY(ctrl_lora_check_choices(m->lora, "LoRA"));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            *a_off(m, l, t) = *b_off(m, l, t) = m->lora_bb[l * LORA_N_TARGETS + t] = -1;
            m->lora_rank[l * LORA_N_TARGETS + t] = 0, m->lora_scales[l * LORA_N_TARGETS + t] = 0;
            if (m->lora_mag) m->lora_mag[l * LORA_N_TARGETS + t] = -1;
        }
        const int moe = m->layers[l].router >= 0;  /* an MoE layer has no gate/up/down_proj linears */
        for (int t = 0; t < LORA_N_TARGETS; t++) { /* each module once, at its first linear */
            int row0, out, in, dummy;
            const int mod = lora_module(m, t, &row0, &out);
            int on, r;
            float s;
            if (row0 != 0 || (moe && t >= LORA_GATE)) continue;
            MODEL_TRY(ctrl_lora_module_choice(m->lora, l, mod, &on, &r, &s));
            if (!on) continue;
            if (m->lora->init == CTRL_LORA_INIT_ORTHOGONAL && r % 2)
                return ctrl_error_set(
                    CTRL_ERR_CONFIG,
                    "LoRA: init_lora_weights = orthogonal needs an even rank (PEFT's refusal); "
                    "model.layers.%d.%s has r = %d",
                    l, ctrl_lora_module_names[mod], r);
            lora_dims(m, t, &in, &dummy);
            long ab_off[2];
            for (int ab = 0; ab < 2; ab++) {
                snprintf(n, sizeof n, "model.layers.%d.%s.lora_%c.weight", l, ctrl_lora_module_names[mod],
                         ab ? 'B' : 'A');
                const int at = m->n_views;
                ab_off[ab] = model_add_view(m, cursor, n, 2, ab ? out : r, ab ? r : in, 0);
                if (at < m->cap_views) m->views[at].lora = 1;
            }
            long bb = -1; /* lora_bias: lora_B.bias [out] */
            if (m->lora->lora_bias) {
                snprintf(n, sizeof n, "model.layers.%d.%s.lora_B.bias", l, ctrl_lora_module_names[mod]);
                const int at = m->n_views;
                bb = model_add_view(m, cursor, n, 1, out, 0, 1);
                if (at < m->cap_views) m->views[at].lora = 1;
            }
            for (int k = t; k < LORA_N_TARGETS; k++) { /* the module's linears: A, and their rows of B */
                int k0, kout;
                if (lora_module(m, k, &k0, &kout) != mod) continue;
                *a_off(m, l, k) = ab_off[0], *b_off(m, l, k) = ab_off[1] + (long)k0 * r;
                m->lora_bb[l * LORA_N_TARGETS + k] = bb < 0 ? -1 : bb + k0;
                m->lora_rank[l * LORA_N_TARGETS + k] = r, m->lora_scales[l * LORA_N_TARGETS + k] = s;
            }
            if (m->lora->use_dora) dora_layout(m, cursor, l, mod, out);
            adapted++;
        }
        if (m->moe_lora) wrapped += lora_moe_layout(m, cursor, l);
    }
    if (m->lora->n_params > 0 && !wrapped) /* PEFT: "target_parameters ... no parameter was matched" */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: target_parameters: no entry names an expert parameter of this %s model "
                              "(only mixture-of-experts layers' experts.gate_up_proj / experts.down_proj)",
                              m->cfg.model_type);
    if (!adapted && !wrapped &&
        (m->lora->n_targets > 0 || m->lora->all_linear)) /* PEFT: "not found in the base model" */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: target_modules: no entry names a linear layer of this %s model%s",
                              m->cfg.model_type,
                              m->cfg.fused_qkv ? " (its projections are the fused qkv_proj and gate_up_proj, "
                                                 "o_proj and down_proj)"
                                               : "");
    return CTRL_OK;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform in (0, 1) from stream `s` (splitmix64). */
static double next_uniform(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    return ((mix64(*s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* nn.init.kaiming_uniform_(a = sqrt(5)) of a [rows, fan_in] weight: U(-1/sqrt(fan_in), +). */
static void kaiming(float *w, int64_t n, int fan_in, uint64_t *s) {
    const double bound = 1.0 / sqrt((double)fan_in);
    for (int64_t i = 0; i < n; i++) w[i] = (float)((2 * next_uniform(s) - 1) * bound);
}

/* lora_A [n floats, fan_in in] of rank r: N(0, 1/r) (Box-Muller) with init gaussian, else Kaiming-uniform. */
static void init_a(const ctrl_model *m, float *A, int64_t n, int in, int r, uint64_t *s) {
    if (m->lora->init != CTRL_LORA_INIT_GAUSSIAN) {
        kaiming(A, n, in, s);
        return;
    }
    for (int64_t i = 0; i < n; i += 2) {
        const double u1 = next_uniform(s), u2 = next_uniform(s), k = sqrt(-2.0 * log(u1)) / r;
        A[i] = (float)(k * cos(2 * M_PI * u2));
        if (i + 1 < n) A[i + 1] = (float)(k * sin(2 * M_PI * u2));
    }
}

/* A standard normal draw (Box-Muller; the second value of the pair unused). */
static double normal(uint64_t *s) {
    const double u1 = next_uniform(s), u2 = next_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2);
}

/* PEFT's orthogonal_init (r even): Q an orthogonal r x r (Gram-Schmidt of a Gaussian one), A = (X_a
 * Q_odd)^T / 10 [r, in] and B = X_b^T Q_even / 10 [out, r] with X Gaussian and Q_odd / Q_even Q's rows 0,
 * 2, ... / 1, 3, ...: B A = X_b^T Q_even Q_odd^T X_a^T / 100 = 0, the adapter starting at nothing while
 * both factors are not zero. */
static void orthogonal(float *A, float *B, int r, int in, int out, uint64_t *s) {
    double *q = malloc(sizeof(double) * (size_t)r * r);
    if (!q) { /* (a few KB; on failure both zero, which still starts the adapter at nothing) */
        memset(A, 0, sizeof(float) * (size_t)r * in), memset(B, 0, sizeof(float) * (size_t)out * r);
        return;
    }
    for (int i = 0; i < r * r; i++) q[i] = normal(s);
    for (int i = 0; i < r; i++) { /* modified Gram-Schmidt over the rows */
        for (int k = 0; k < i; k++) {
            double d = 0;
            for (int j = 0; j < r; j++) d += q[i * r + j] * q[k * r + j];
            for (int j = 0; j < r; j++) q[i * r + j] -= d * q[k * r + j];
        }
        double n = 0;
        for (int j = 0; j < r; j++) n += q[i * r + j] * q[i * r + j];
        for (int j = 0; j < r; j++) q[i * r + j] /= sqrt(n);
    }
    const int h = r / 2;
    memset(A, 0, sizeof(float) * (size_t)r * in), memset(B, 0, sizeof(float) * (size_t)out * r);
    for (int i = 0; i < in; i++)
        for (int k = 0; k < h; k++) { /* A[j][i] = sum_k X_a[i][k] Q[2k][j] / 10 */
            const double x = normal(s) / 10;
            for (int j = 0; j < r; j++) A[(size_t)j * in + i] += (float)(x * q[(2 * k) * r + j]);
        }
    for (int k = 0; k < h; k++)
        for (int o = 0; o < out; o++) { /* B[o][j] = sum_k X_b[k][o] Q[2k + 1][j] / 10 */
            const double x = normal(s) / 10;
            for (int j = 0; j < r; j++) B[(size_t)o * r + j] += (float)(x * q[(2 * k + 1) * r + j]);
        }
    free(q);
}

void lora_init(ctrl_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            int in, out, row0, slot_out;
            lora_module(m, t, &row0, &out); /* a fused module's A and whole B, at its first linear */
            /* pissa / olora: set from the base weight as it loads (lora_from_base.c) */
            if (*a_off(m, l, t) < 0 || row0 != 0 || lora_init_from_base_on(m->lora)) continue;
            lora_dims(m, t, &in, &slot_out);
            float *A = m->params + *a_off(m, l, t), *B = m->params + *b_off(m, l, t);
            uint64_t s =
                mix64(m->lora->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(l * LORA_N_TARGETS + t + 1)));
            const int r = lora_r(m, l, t);
            if (m->lora->init == CTRL_LORA_INIT_ORTHOGONAL) {
                orthogonal(A, B, r, in, out, &s);
                continue;
            }
            init_a(m, A, (int64_t)r * in, in, r, &s);
            if (m->lora->init == CTRL_LORA_INIT_NONE)
                kaiming(B, (int64_t)out * r, r, &s);
            else
                memset(B, 0, sizeof(float) * (size_t)out * r);
            if (m->lora_bb[l * LORA_N_TARGETS + t] >= 0) { /* nn.Linear(r, out)'s bias, or zero */
                float *bb = m->params + m->lora_bb[l * LORA_N_TARGETS + t];
                if (m->lora->init == CTRL_LORA_INIT_NONE)
                    kaiming(bb, out, r, &s);
                else
                    memset(bb, 0, sizeof(float) * (size_t)out);
            }
        }
    for (int i = 0; m->moe_lora && i < m->cfg.n_layers * 4; i += 2) { /* the experts': lora_A, lora_B */
        if (m->moe_lora[i] < 0) continue;
        const ctrl_param_view *va = NULL, *vb = NULL;
        for (int v = 0; v < m->n_views && !vb; v++)
            if (m->views[v].offset == (size_t)m->moe_lora[i]) va = &m->views[v], vb = va + 1;
        uint64_t s = mix64(m->lora->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1)));
        init_a(m, m->params + va->offset, va->numel, (int)va->shape[1], m->lora->r,
               &s); /* nn.Linear(in, E r) */
        if (m->lora->init == CTRL_LORA_INIT_NONE)
            kaiming(m->params + vb->offset, vb->numel, (int)vb->shape[1], &s); /* nn.Linear(E r, out) */
        else
            memset(m->params + vb->offset, 0, sizeof(float) * (size_t)vb->numel);
    }
    ctrl_model_weights_changed(m);
}

size_t lora_act_floats(const ctrl_model *m, int l) {
    if (!m->has_lora) return 0;
    size_t n = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        int r = 0; /* the shared set: room for the largest of the recomputed layers' */
        for (int k = 0; k < m->cfg.n_layers; k++)
            if ((l < 0 ? model_recomputed(m, k) : k == l) && lora_r(m, k, t) > r) r = lora_r(m, k, t);
        n += (size_t)r;
    }
    return n;
}

int lora_dropout_on(const ctrl_model *m) { return m->training && m->lora->lora_dropout > 0; }

void lora_base_weight(const ctrl_model *m, int l, int t, long *w, long *bias) {
    const layer_offsets *o = &m->layers[l];
    const long ws[LORA_N_TARGETS] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    *w = ws[t];
    *bias = t == LORA_Q ? o->bq : t == LORA_K ? o->bk : t == LORA_V ? o->bv : -1;
}

void lora_dropout_host(float *out, const float *x, int64_t n, uint64_t key, float p, float keep) {
    for (int64_t i = 0; i < n; i++) {
        const double u =
            ((mix64(key + (uint64_t)i * 0x9E3779B97F4A7C15ull) >> 11) + 0.5) / 9007199254740992.0;
        out[i] = u < p ? 0.0f : x[i] * keep;
    }
}

/* The mask's key: a function of (seed, step, layer, target); the linears of a fused module share
 * its first one's (PEFT drops the module's input once). */
static uint64_t dropout_key(const ctrl_model *m, int l, int t) {
    int row0, mod_out;
    const int mod = lora_module(m, t, &row0, &mod_out);
    t = mod == LORA_QKV ? LORA_Q : mod == LORA_GATE_UP ? LORA_GATE : t;
    return mix64(m->lora->seed ^ mix64(m->lora_step * 0x100000001B3ull + (uint64_t)l * 7 + t));
}

/* Scratch: xa [T, r] (decoding, which keeps none), the dropped-out input or dA's dx [T, max width],
 * the adapter's output or its dx [T, max width], and DoRA's third [T, max width]. */
ctrl_status lora_scratch(ctrl_model *m, float **xa, float **w1, float **w2, float **w3) {
    const ctrl_model_config *c = &m->cfg;
    size_t wide = (size_t)c->hidden_size;
    const size_t cand[3] = {(size_t)c->intermediate_size, (size_t)c->n_heads * c->head_dim,
                            (size_t)c->n_kv_heads * c->head_dim};
    for (int i = 0; i < 3; i++) wide = cand[i] > wide ? cand[i] : wide;
    const size_t T = (size_t)m->T;
    MODEL_TRY(model_grow(m, (void **)&m->lora_ws, &m->lora_ws_bytes,
                         sizeof(float) * T * ((size_t)ctrl_lora_max_rank(m->lora) + 3 * wide)));
    *xa = m->lora_ws, *w1 = *xa + T * (size_t)ctrl_lora_max_rank(m->lora), *w2 = *w1 + T * wide,
    *w3 = *w2 + T * wide;
    return CTRL_OK;
}

/* dst = dropout(src) [n] by the backend's lora_dropout op (the CPU's, or a device's drawing the same
 * mask where the values are); a device without the op (an older backend library) makes a round trip
 * through m->lora_host. */
ctrl_status lora_apply_dropout(ctrl_model *m, int l, int t, float *dst, const float *src, int64_t n) {
    const float p = m->lora->lora_dropout, keep = 1.0f / (1.0f - p);
    const uint64_t key = dropout_key(m, l, t);
    if (ctrl_backend_has(m->be, lora_dropout)) return m->be->lora_dropout(dst, src, n, key, p, keep);
    if ((size_t)n > m->lora_host_n) {
        free(m->lora_host);
        if (!(m->lora_host = malloc(sizeof(float) * (size_t)n))) {
            m->lora_host_n = 0;
            return ctrl_error_set(CTRL_ERR_NOMEM, "LoRA dropout: %lld floats of host staging", (long long)n);
        }
        m->lora_host_n = (size_t)n;
    }
    MODEL_TRY(m->be->to_host(m->lora_host, src, sizeof(float) * (size_t)n));
    lora_dropout_host(m->lora_host, m->lora_host, n, key, p, keep);
    return m->be->to_device(dst, m->lora_host, sizeof(float) * (size_t)n);
}

int lora_reads(const ctrl_model *m, int l, int t, int x) {
    return m->has_lora && !m->lora_off && !m->dec_adapters && *a_off(m, l, t) >= 0 && !m->lora->use_dora &&
           !(x && lora_dropout_on(m));
}

ctrl_status lora_forward(ctrl_model *m, int l, int t, layer_acts *a, float *out, const float *x, int IN,
                         int OUT) {
    if (m->dec_adapters && out) return lora_bank_forward(m, l, t, out, x, IN, OUT); /* serving */
    if (!m->has_lora || m->lora_off || *a_off(m, l, t) < 0) return CTRL_OK;
    const ctrl_backend_ops *be = m->be;
    const int T = m->T, r = lora_r(m, l, t);
    const float *P = m->dparams;
    float *xa, *w1, *w2, *w3;
    MODEL_TRY(lora_scratch(m, &xa, &w1, &w2, &w3));
    if (a->lora_xa[t]) xa = a->lora_xa[t];
    if (lora_dropout_on(m) && a->lora_xa[t]) { /* decoding (no lora_xa) runs without */
        MODEL_TRY(lora_apply_dropout(m, l, t, w1, x, (int64_t)T * IN));
        x = w1;
    }
    MODEL_TRY(model_linear_forward(m, xa, x, P + *a_off(m, l, t), NULL, T, IN, r));
    MODEL_TRY(be->scale(xa, lora_s(m, l, t), (int64_t)T * r));
    if (!out) return CTRL_OK; /* a recompute for backward: lora_xa is all it needs */
    const float *sb = NULL;   /* lora_bias: s b, as (x A^T B^T + b) s */
    if (m->lora_bb[l * LORA_N_TARGETS + t] >= 0) {
        MODEL_TRY(be->copy(w3, P + m->lora_bb[l * LORA_N_TARGETS + t], sizeof(float) * (size_t)OUT));
        MODEL_TRY(be->scale(w3, lora_s(m, l, t), OUT));
        sb = w3;
    }
    MODEL_TRY(model_linear_forward(m, w2, xa, P + *b_off(m, l, t), sb, T, r, OUT));
    if (!m->lora->use_dora) return be->residual_forward(out, out, w2, (int64_t)T * OUT);
    if (x != w1) return dora_combine(m, l, t, out, w2, NULL, OUT); /* no dropout: out - b is x W^T */
    long w, bias;
    lora_base_weight(m, l, t, &w, &bias);
    MODEL_TRY(model_linear_forward(m, w3, x, P + w, NULL, T, IN, OUT)); /* PEFT's F.linear(dropout(x), W) */
    return dora_combine(m, l, t, out, w2, w3, OUT);
}

ctrl_status lora_backward(ctrl_model *m, int l, int t, const layer_acts *a, float *dx, const float *dout,
                          const float *x, int IN, int OUT) {
    if (!m->has_lora || m->lora_off || *a_off(m, l, t) < 0) return CTRL_OK;
    if (m->lora->use_dora) return dora_backward(m, l, t, a, dx, dout, x, IN, OUT);
    const ctrl_backend_ops *be = m->be;
    const int T = m->T, r = lora_r(m, l, t);
    const float *P = m->dparams;
    float *dxa, *w1, *w2, *w3;
    MODEL_TRY(lora_scratch(m, &dxa, &w1, &w2, &w3));
    const long ao = *a_off(m, l, t), bo = *b_off(m, l, t), bb = m->lora_bb[l * LORA_N_TARGETS + t];
    if (bb >= 0)
        MODEL_TRY(be->fill_zero(w3, sizeof(float) * (size_t)OUT)); /* lora_bias: db = s colsum(dout) */
    MODEL_TRY(model_linear_backward(m, dxa, model_grad(m, bo), bb >= 0 ? w3 : NULL, dout, a->lora_xa[t],
                                    P + bo, T, r, OUT));
    if (bb >= 0) {
        MODEL_TRY(be->scale(w3, lora_s(m, l, t), OUT));
        MODEL_TRY(be->residual_forward(model_grad(m, bb), model_grad(m, bb), w3, OUT));
    }
    MODEL_TRY(be->scale(dxa, lora_s(m, l, t), (int64_t)T * r));
    const int drop = lora_dropout_on(m);
    if (drop) {
        MODEL_TRY(lora_apply_dropout(m, l, t, w1, x, (int64_t)T * IN));
        x = w1;
    }
    MODEL_TRY(model_linear_backward(m, w2, model_grad(m, ao), NULL, dxa, x, P + ao, T, IN, r));
    if (drop) { /* through the mask: the same draw with the input's place taken by dx */
        MODEL_TRY(lora_apply_dropout(m, l, t, w1, w2, (int64_t)T * IN));
        MODEL_TRY(be->copy(w2, w1, sizeof(float) * (size_t)T * IN));
    }
    return be->residual_forward(dx, dx, w2, (int64_t)T * IN);
}
