/* Several LoRA adapters over one base model for decoding (ctrl serve --lora NAME=DIR, vLLM's
 * multi-LoRA serving): each adapter of the bank holds its own config and lora_A / lora_B weights
 * (host memory, as decoding), and a decode call is told which adapter each sequence runs under
 * (ctrl_model_set_decode_adapters). A projection then adds, for each run of consecutive sequences
 * under the same adapter, s * (x A^T) B^T over those rows only: one batch mixes adapters and the
 * base (PEFT's mixed-batch forward). Adapters come and go while serving (ctrl_model_remove_adapter
 * leaves an empty slot: ids are never reused). Expert adapters of a mixture of experts (PEFT's
 * target_parameters) are served too: an expert's routed rows are its tokens in order (model_moe.c),
 * so the rows of one sequence are consecutive there as well, and each run of rows under one adapter
 * gets that adapter's W_e + s B_e A_e share (lora_moe.c's arithmetic, the adapter's lora_B held
 * expert after expert as there). Only plain LoRA: DoRA and modules_to_save adapters are refused
 * (PEFT refuses DoRA in mixed batches too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/peft.h"
#include "model/safetensors.h"

struct lora_bank_entry {
    ctrl_lora_config cfg;
    float scale; /* the experts' (the config's r and lora_alpha) */
    long *a, *b; /* [n_layers][LORA_N_TARGETS] offsets into w, -1 where none */
    int *r;      /* [n_layers][LORA_N_TARGETS] each adapter's rank (rank_pattern) and scaling */
    float *s;
    long *bb;  /* [n_layers][LORA_N_TARGETS] lora_B.bias offsets into w (lora_bias), -1 where none */
    long *moe; /* [n_layers][4]: the experts' gate_up lora_A, lora_B, down lora_A, lora_B; -1: none */
    float *w;
};

static void entry_free(lora_bank_entry *e) {
    if (!e) return;
    free(e->a), free(e->b), free(e->r), free(e->s), free(e->bb), free(e->moe), free(e->w);
    free(e);
}

void lora_bank_free(ctrl_model *m) {
    for (int i = 0; i < m->n_bank; i++) entry_free(m->bank[i]);
    free(m->bank), free(m->bank_ws);
    m->bank = NULL, m->n_bank = 0, m->bank_ws = NULL, m->bank_ws_n = 0;
}

/* Tensor `name` of f, [d0, d1] (d0 < 0: a vector [d1]) and finite, into dst. */
static ctrl_status read_tensor(ctrl_safetensors *f, const char *path, const char *name, int64_t d0,
                               int64_t d1, float *dst) {
    const ctrl_st_tensor *x = ctrl_safetensors_find(f, name);
    const int nd = d0 < 0 ? 1 : 2;
    if (!x || x->ndim != nd || (nd == 2 && x->shape[0] != d0) || x->shape[nd - 1] != d1) {
        char want[64];
        snprintf(want, sizeof want, nd == 2 ? "[%lld, %lld]" : "[%lld]", (long long)(nd == 2 ? d0 : d1),
                 (long long)d1);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s '%s' (adapter_config.json implies %s)", path,
                              x ? "a wrongly shaped" : "no tensor", name, want);
    }
    float bad;
    const int64_t at = ctrl_safetensors_find_non_finite(f, x, &bad);
    if (at >= 0)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: '%s' holds %g at element %lld", path, name, (double)bad,
                              (long long)at);
    return ctrl_safetensors_read_f32(f, name, dst, nd == 2 ? d0 * d1 : d1);
}

/* An expert's adapter k's (LORA_MOE_GATE_UP, LORA_MOE_DOWN) input and output widths. */
static void moe_dims(const ctrl_model *m, int k, int *in, int *out) {
    const int C = m->cfg.hidden_size, Im = m->cfg.moe_intermediate_size;
    *in = k == LORA_MOE_DOWN ? Im : C, *out = k == LORA_MOE_DOWN ? C : 2 * Im;
}

/* Layer l's expert adapter k of f into e: lora_A as it is, lora_B from PEFT's [out, E r] into
 * expert after expert (under PEFT's names: gate_up_proj's wrapper nested under base_layer. when
 * down_proj is wrapped too, lora_moe.c). */
static ctrl_status read_expert(const ctrl_model *m, lora_bank_entry *e, ctrl_safetensors *f, const char *path,
                               int l, int k) {
    const int E = m->cfg.n_experts, r = e->cfg.r;
    int in, out;
    moe_dims(m, k, &in, &out);
    const char *nest = k == LORA_MOE_GATE_UP && e->moe[l * 4 + 2] >= 0 ? ".base_layer" : "";
    char name[CTRL_ST_MAX_NAME];
    snprintf(name, sizeof name, "base_model.model.model.layers.%d.mlp.experts%s.lora_A.weight", l, nest);
    MODEL_TRY(read_tensor(f, path, name, (int64_t)E * r, in, e->w + e->moe[l * 4 + 2 * k]));
    float *tmp = malloc(sizeof(float) * (size_t)out * E * r);
    if (!tmp) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    snprintf(name, sizeof name, "base_model.model.model.layers.%d.mlp.experts%s.lora_B.weight", l, nest);
    const ctrl_status st = read_tensor(f, path, name, out, (int64_t)E * r, tmp);
    if (st == CTRL_OK) ctrl_peft_expert_b_layout(E, out, r, tmp, e->w + e->moe[l * 4 + 2 * k + 1], 0);
    free(tmp);
    return st;
}

/* The adapter of DIR's tensors into e (every one the config implies, shapes checked; no other). */
static ctrl_status read_weights(const ctrl_model *m, lora_bank_entry *e, const char *dir) {
    char path[4200], name[CTRL_ST_MAX_NAME];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const int L = m->cfg.n_layers;
    size_t n = 0;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) { /* a fused module's linears share its A, rows of its B */
            int in, out, row0, mod_out;
            const int mod = lora_module(m, t, &row0, &mod_out), first = mod == LORA_QKV       ? LORA_Q
                                                                        : mod == LORA_GATE_UP ? LORA_GATE
                                                                                              : t;
            e->a[l * LORA_N_TARGETS + t] = e->b[l * LORA_N_TARGETS + t] = e->bb[l * LORA_N_TARGETS + t] = -1;
            int on, r;
            MODEL_TRY(ctrl_lora_module_choice(&e->cfg, l, mod, &on, &r, &e->s[l * LORA_N_TARGETS + t]));
            if (!on) continue;
            e->r[l * LORA_N_TARGETS + t] = r;
            if (row0) {
                e->a[l * LORA_N_TARGETS + t] = e->a[l * LORA_N_TARGETS + first];
                e->b[l * LORA_N_TARGETS + t] = e->b[l * LORA_N_TARGETS + first] + (long)row0 * r;
                if (e->cfg.lora_bias)
                    e->bb[l * LORA_N_TARGETS + t] = e->bb[l * LORA_N_TARGETS + first] + row0;
                continue;
            }
            lora_dims(m, t, &in, &out);
            e->a[l * LORA_N_TARGETS + t] = (long)n, n += (size_t)r * in;
            e->b[l * LORA_N_TARGETS + t] = (long)n, n += (size_t)mod_out * r;
            if (e->cfg.lora_bias) e->bb[l * LORA_N_TARGETS + t] = (long)n, n += (size_t)mod_out;
        }
    int wrapped = 0;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < LORA_MOE_N; k++) { /* lora_A [E r, in], lora_B [out, E r] */
            long *at = &e->moe[l * 4 + 2 * k];
            at[0] = at[1] = -1;
            if (m->layers[l].router < 0 || !ctrl_lora_targets_param(&e->cfg, l, k)) continue;
            int in, out;
            moe_dims(m, k, &in, &out);
            at[0] = (long)n, n += (size_t)m->cfg.n_experts * e->cfg.r * in;
            at[1] = (long)n, n += (size_t)m->cfg.n_experts * e->cfg.r * out;
            wrapped++;
        }
    if (e->cfg.n_params > 0 && !wrapped) /* PEFT: "target_parameters ... no parameter was matched" */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s/adapter_config.json: \"target_parameters\": no entry names an expert "
                              "parameter of this %s model",
                              dir, m->cfg.model_type);
    if (!(e->w = malloc(sizeof(float) * (n ? n : 1))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: %zu adapter weights", dir, n);
    ctrl_safetensors *f = NULL;
    MODEL_TRY(ctrl_safetensors_open(path, &f));
    ctrl_status st = CTRL_OK;
    int used = 0;
    for (int l = 0; l < L && st == CTRL_OK; l++)
        for (int t = 0; t < LORA_N_TARGETS && st == CTRL_OK; t++) {
            int in, out, row0, slot_out;
            const int mod = lora_module(m, t, &row0, &out);
            if (row0) continue; /* each module once, at its first linear */
            lora_dims(m, t, &in, &slot_out);
            const int r = e->r[l * LORA_N_TARGETS + t];
            for (int ab = 0; ab < 2 && st == CTRL_OK && e->a[l * LORA_N_TARGETS + t] >= 0; ab++) {
                const int64_t d0 = ab ? out : r, d1 = ab ? r : in;
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l,
                         ctrl_lora_module_names[mod], ab ? 'B' : 'A');
                st = read_tensor(f, path, name, d0, d1, e->w + (ab ? e->b : e->a)[l * LORA_N_TARGETS + t]);
                used++;
            }
            if (st == CTRL_OK && e->bb[l * LORA_N_TARGETS + t] >= 0) { /* lora_bias: lora_B.bias [out] */
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.bias", l,
                         ctrl_lora_module_names[mod]);
                st = read_tensor(f, path, name, -1, out, e->w + e->bb[l * LORA_N_TARGETS + t]);
                used++;
            }
        }
    for (int l = 0; l < L && st == CTRL_OK; l++)
        for (int k = 0; k < LORA_MOE_N && st == CTRL_OK; k++)
            if (e->moe[l * 4 + 2 * k] >= 0) st = read_expert(m, e, f, path, l, k), used += 2;
    if (st == CTRL_OK && used != ctrl_safetensors_count(f))
        st = ctrl_error_set(CTRL_ERR_FORMAT,
                            "%s: %d tensors, of which adapter_config.json explains %d (modules_to_save or "
                            "DoRA magnitudes cannot be served beside other adapters)",
                            path, ctrl_safetensors_count(f), used);
    ctrl_safetensors_close(f);
    return st;
}

ctrl_status ctrl_model_add_adapter(ctrl_model *m, const char *dir, int *id) {
    if (m->has_lora)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: the model has its own adapters; serve a plain base",
                              dir);
    lora_bank_entry *e = calloc(1, sizeof *e);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", dir);
    ctrl_status st = ctrl_peft_read_config(dir, &e->cfg, NULL, 0);
    if (st == CTRL_OK && e->cfg.use_dora)
        st = ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                            "%s/adapter_config.json: \"use_dora\": a DoRA adapter cannot be served beside "
                            "others (as in PEFT's mixed batches); merge it (ctrl model merge) and serve the "
                            "merged model",
                            dir);
    if (st == CTRL_OK && lora_init_from_base_on(&e->cfg))
        st = ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s/adapter_config.json: \"init_lora_weights\": %s: such an adapter applies to the "
            "base's residual, not to the base others share; merge it (ctrl model merge) and serve "
            "the merged model",
            dir, e->cfg.init == CTRL_LORA_INIT_PISSA ? "pissa" : "olora");
    if (st == CTRL_OK && e->cfg.seq_cls)
        st = ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                            "%s/adapter_config.json: \"task_type\": SEQ_CLS, a sequence classifier's "
                            "adapter (a reward model): it scores, it does not generate",
                            dir);
    if (st == CTRL_OK && (e->cfg.save_embed_tokens || e->cfg.save_lm_head))
        st = ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                            "%s/adapter_config.json: \"modules_to_save\": an adapter that replaces the "
                            "embeddings or the head cannot be served beside others; merge it",
                            dir);
    if (st == CTRL_OK && (e->cfg.n_tokens > 0 || e->cfg.n_head_tokens > 0))
        st =
            ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                           "%s/adapter_config.json: \"trainable_token_indices\": an adapter that replaces "
                           "rows of the embedding table cannot be served beside others; merge it (ctrl model "
                           "merge) and serve the merged model",
                           dir);
    if (st == CTRL_OK) {
        const size_t n = (size_t)m->cfg.n_layers * LORA_N_TARGETS;
        e->a = malloc(sizeof(long) * n), e->b = malloc(sizeof(long) * n);
        e->r = malloc(sizeof(int) * n), e->s = malloc(sizeof(float) * n), e->bb = malloc(sizeof(long) * n);
        e->moe = malloc(sizeof(long) * 4 * (size_t)m->cfg.n_layers);
        st = e->a && e->b && e->r && e->s && e->bb && e->moe
                 ? read_weights(m, e, dir)
                 : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", dir);
    }
    lora_bank_entry **p = st == CTRL_OK ? realloc(m->bank, sizeof *p * (size_t)(m->n_bank + 1)) : NULL;
    if (st == CTRL_OK && !p) st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", dir);
    if (st != CTRL_OK) {
        entry_free(e);
        return st;
    }
    e->scale = ctrl_lora_scaling(&e->cfg);
    m->bank = p, m->bank[m->n_bank++] = e;
    *id = m->n_bank;
    return CTRL_OK;
}

int ctrl_model_adapter_count(const ctrl_model *m) { return m->n_bank; }

ctrl_status ctrl_model_remove_adapter(ctrl_model *m, int id) {
    if (id < 1 || id > m->n_bank || !m->bank[id - 1])
        return ctrl_error_set(CTRL_ERR_RUNTIME, "LoRA adapter %d: not in the model's bank", id);
    entry_free(m->bank[id - 1]);
    m->bank[id - 1] = NULL; /* ids stay: the others keep theirs */
    return CTRL_OK;
}

void ctrl_model_set_decode_adapters(ctrl_model *m, const int *adapter_of_seq) {
    m->dec_adapters = adapter_of_seq;
}

/* out = x w^T (+ bias) in the model's compute dtype (w outside the parameters: rounded on the fly in bf16).
 */
static ctrl_status linear(const ctrl_model *m, float *out, const float *x, const float *w, const float *bias,
                          int T, int IN, int OUT) {
    return m->linear_bf16 ? m->be->linear_forward_bf16(out, x, w, bias, T, IN, OUT, 0)
                          : m->be->linear_forward(out, x, w, bias, T, IN, OUT);
}

/* The bank's scratch: room for xa [rows, max r], an output [rows, OUT] and lora_bias's s b [OUT]. */
static ctrl_status scratch(ctrl_model *m, int rows, int OUT) {
    int max_r = 1;
    for (int i = 0; i < m->n_bank; i++)
        if (m->bank[i] && ctrl_lora_max_rank(&m->bank[i]->cfg) > max_r)
            max_r = ctrl_lora_max_rank(&m->bank[i]->cfg);
    const size_t need = (size_t)rows * ((size_t)max_r + (size_t)OUT) + (size_t)OUT;
    if (need > m->bank_ws_n) {
        free(m->bank_ws);
        if (!(m->bank_ws = malloc(sizeof(float) * need))) {
            m->bank_ws_n = 0;
            return ctrl_error_set(CTRL_ERR_NOMEM, "decode: LoRA scratch for %d rows", rows);
        }
        m->bank_ws_n = need;
    }
    return CTRL_OK;
}

/* out [rows, OUT] += s (x A^T B^T + b) of an adapter of rank r (x [rows, IN], A [r, IN], B [OUT, r]; b
 * [OUT]: lora_bias's, or NULL). */
static ctrl_status add_adapter(ctrl_model *m, int r, float s, const float *A, const float *B, const float *b,
                               const float *x, int rows, int IN, int OUT, float *out) {
    float *xa = m->bank_ws, *y = xa + (size_t)rows * r, *sb = y + (size_t)rows * OUT;
    MODEL_TRY(linear(m, xa, x, A, NULL, rows, IN, r));
    MODEL_TRY(m->be->scale(xa, s, (int64_t)rows * r));
    if (b) {
        MODEL_TRY(m->be->copy(sb, b, sizeof(float) * (size_t)OUT));
        MODEL_TRY(m->be->scale(sb, s, OUT));
    }
    MODEL_TRY(linear(m, y, xa, B, b ? sb : NULL, rows, r, OUT));
    return m->be->residual_forward(out, out, y, (int64_t)rows * OUT);
}

ctrl_status lora_bank_moe(ctrl_model *m, int l, int k, int ex, const float *xs, int n, float *o1, float *o2) {
    const int K = m->cfg.n_experts_per_tok, Im = m->cfg.moe_intermediate_size;
    const int32_t *idx = m->moe[l].idx; /* host [T, K]: each token's experts */
    int in, out;
    moe_dims(m, k, &in, &out);
    const int OUT = k == LORA_MOE_DOWN ? out : Im; /* gate_up: gate's and up's Im rows each */
    MODEL_TRY(scratch(m, n, OUT));
    for (int s = 0, t = 0, j = 0; s < m->dec_n_seq;) { /* a run of sequences under one adapter */
        const int ad = m->dec_adapters[s], j0 = j;
        for (; s < m->dec_n_seq && m->dec_adapters[s] == ad; s++) /* expert ex's rows: its tokens in order */
            for (const int end = t + m->dec_n_new[s]; t < end; t++)
                for (int q = 0; q < K; q++) j += idx[(size_t)t * K + q] == ex;
        const lora_bank_entry *e = ad > 0 && ad <= m->n_bank ? m->bank[ad - 1] : NULL;
        const long ao = e ? e->moe[l * 4 + 2 * k] : -1;
        if (ao < 0 || j == j0) continue;
        const int r = e->cfg.r;
        const float *A = e->w + ao + (size_t)ex * r * in,
                    *B = e->w + e->moe[l * 4 + 2 * k + 1] + (size_t)ex * out * r, *x = xs + (size_t)j0 * in;
        MODEL_TRY(add_adapter(m, r, e->scale, A, B, NULL, x, j - j0, in, OUT, o1 + (size_t)j0 * OUT));
        if (k == LORA_MOE_GATE_UP) /* up's rows of B_e (x A_e^T again: decoding's rows are few) */
            MODEL_TRY(add_adapter(m, r, e->scale, A, B + (size_t)Im * r, NULL, x, j - j0, in, Im,
                                  o2 + (size_t)j0 * Im));
    }
    return CTRL_OK;
}

ctrl_status lora_bank_forward(ctrl_model *m, int l, int t, float *out, const float *x, int IN, int OUT) {
    const int *ad = m->dec_adapters, *n_new = m->dec_n_new;
    MODEL_TRY(scratch(m, m->T, OUT));
    for (int s = 0, t0 = 0; s < m->dec_n_seq;) {
        int rows = 0, e_end = s; /* a run of sequences under one adapter */
        while (e_end < m->dec_n_seq && ad[e_end] == ad[s]) rows += n_new[e_end++];
        const lora_bank_entry *e = ad[s] > 0 && ad[s] <= m->n_bank ? m->bank[ad[s] - 1] : NULL;
        const long ao = e ? e->a[l * LORA_N_TARGETS + t] : -1;
        if (ao >= 0)
            MODEL_TRY(
                add_adapter(m, e->r[l * LORA_N_TARGETS + t], e->s[l * LORA_N_TARGETS + t], e->w + ao,
                            e->w + e->b[l * LORA_N_TARGETS + t],
                            e->bb[l * LORA_N_TARGETS + t] >= 0 ? e->w + e->bb[l * LORA_N_TARGETS + t] : NULL,
                            x + (size_t)t0 * IN, rows, IN, OUT, out + (size_t)t0 * OUT));
        t0 += rows, s = e_end;
    }
    return CTRL_OK;
}
