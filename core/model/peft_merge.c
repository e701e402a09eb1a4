/* Adapters in and out of a model in one call (ctrl_peft_load), and folded into the base weights
 * (ctrl_peft_merge: PEFT's merge_and_unload): W += s * B A for every adapter, on the host copy;
 * with DoRA then each row j scaled by magnitude_j / ||row j|| (the norm of the unmerged W + s B A,
 * as PEFT's DoRA merge computes it); and the same folded into a copy written to a file, the model untouched
 * (ctrl_peft_save_merged_weights: server mode's push, PEFT's merge_adapter + unmerge_adapter in one). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"

#include "model/model_internal.h"
#include "model/peft.h"
#include "model/safetensors.h"

static ctrl_status load(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                        int bf16, ctrl_model **out) {
    static ctrl_lora_config lc; /* large (the target list): not on the stack */
    *out = NULL;
    MODEL_TRY(ctrl_peft_read_config(adapter_dir, &lc, NULL, 0));
    /* for bf16 inference: the base held as the bf16 GEMM's panels as it loads, a table of bf16 values
     * in bf16 alone (model_bf16_store.c, model_embed16.c) */
    if (bf16) lc.bf16_base = 2, lc.bf16_embed = 4;
    ctrl_model *m;
    if (lc.seq_cls) { /* a classifier's adapter (SEQ_CLS): the base's trunk, the adapter's score */
        ctrl_model_config cfg;
        MODEL_TRY(ctrl_model_config_load(base_dir, &cfg));
        MODEL_TRY(ctrl_model_load_classifier_lora(base_dir, attn, cfg.num_labels > 0 ? cfg.num_labels : 1, 0,
                                                  &lc, &m));
    } else
        MODEL_TRY(ctrl_model_load_lora(base_dir, attn, &lc, &m));
    ctrl_status st = ctrl_peft_load_weights(m, adapter_dir);
    if (st != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    if (bf16 && (st = ctrl_model_set_compute_dtype(m, CTRL_BF16)) != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    *out = m;
    return CTRL_OK;
}

ctrl_status ctrl_peft_load(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                           ctrl_model **out) {
    return load(base_dir, adapter_dir, attn, 0, out);
}

ctrl_status ctrl_peft_load_bf16(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                                ctrl_model **out) {
    return load(base_dir, adapter_dir, attn, 1, out);
}

/* Linear t of layer l folded into W (its base weight [OUT, IN]: in the parameters, or a copy of them):
 * W += s B [OUT, r] A [r, IN] (a fused module's linear has its row block of B); with DoRA each row j then
 * scaled to m_j / ||W_j + s (B A)_j||; with lora_bias the base's bias (bias: in the parameters or a copy) +=
 * s b (bias_mergeable). */
static ctrl_status bias_mergeable(const ctrl_model *m, int l, int t, const float *bias) {
    if (m->lora_bb[l * LORA_N_TARGETS + t] < 0 || bias) return CTRL_OK;
    return ctrl_error_set(
        CTRL_ERR_UNSUPPORTED,
        "merge: layer %d's %s has lora_bias but the base layer has no bias (PEFT: \"Impossible "
        "to merge LoRA with lora_bias=True because the base layer has no bias\")",
        l, ctrl_lora_target_names[t]);
}

static ctrl_status merge_linear(const ctrl_model *m, int l, int t, float *W, float *bias) {
    MODEL_TRY(bias_mergeable(m, l, t, bias));
    const long bb = m->lora_bb[l * LORA_N_TARGETS + t];
    const int r = lora_r(m, l, t);
    const long ao = m->lora_a[l * LORA_N_TARGETS + t], bo = m->lora_b[l * LORA_N_TARGETS + t];
    int IN, OUT;
    lora_dims(m, t, &IN, &OUT);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OUT, IN, r, lora_s(m, l, t), m->params + bo, r,
                m->params + ao, IN, 1.0f, W, IN);
    const long mo = m->lora_mag ? m->lora_mag[l * LORA_N_TARGETS + t] : -1;
    for (int j = 0; mo >= 0 && j < OUT; j++) {
        float *row = W + (size_t)j * IN;
        double n2 = 0;
        for (int i = 0; i < IN; i++) n2 += (double)row[i] * row[i];
        const float f = m->params[mo + j] / (float)sqrt(n2);
        for (int i = 0; i < IN; i++) row[i] *= f;
    }
    for (int j = 0; bb >= 0 && j < OUT; j++) bias[j] += lora_s(m, l, t) * m->params[bb + j];
    return CTRL_OK;
}

ctrl_status ctrl_peft_merge(ctrl_model *m) {
    if (!m->has_lora) return ctrl_error_set(CTRL_ERR_RUNTIME, "merge: the model has no LoRA adapters");
    if (m->nf4_w)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "merge: the base is held in NF4 (QLoRA); merge into the full-precision base "
                              "(ctrl model merge --base DIR --adapter DIR)");
    for (int l = 0; l < m->cfg.n_layers; l++) /* what cannot merge refused before anything changes */
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            long w, bias;
            lora_base_weight(m, l, t, &w, &bias);
            MODEL_TRY(bias_mergeable(m, l, t, bias >= 0 ? m->params + bias : NULL));
        }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            long w, bias;
            lora_base_weight(m, l, t, &w, &bias);
            if (m->lora_a[l * LORA_N_TARGETS + t] >= 0)
                MODEL_TRY(merge_linear(m, l, t, m->params + w, bias >= 0 ? m->params + bias : NULL));
        }
        if (m->layers[l].router >= 0) /* the experts' (target_parameters) */
            lora_moe_merge(m, l, m->params + m->layers[l].experts);
    }
    lora_tokens_merge(m); /* trainable_token_indices' rows into the table */
    m->lora_merged = 1;   /* (their tables, and modules_to_save's trained ones, stay so) */
    m->lora_off = 1;      /* the adapters are in the weights now */
    ctrl_model_weights_changed(m);
    return CTRL_OK;
}

/* The decoder layer a view belongs to (-1: none), by its HF name, as model_bf16_store.c lays them out. */
static int view_layer(const ctrl_param_view *v, int L) {
    int l = -1, n = 0;
    return sscanf(v->name, "model.layers.%d.%n", &l, &n) == 1 && n > 0 && l >= 0 && l < L ? l : -1;
}

/* Where parameter `off` of layer l lies in `out` (the views' values one after another from pos[v]). */
static float *copy_at(const ctrl_model *m, float *out, const size_t *pos, int l, long off) {
    for (int v = 0; v < m->n_views; v++) {
        const ctrl_param_view *pv = &m->views[v];
        if (!pv->lora && view_layer(pv, m->cfg.n_layers) == l && off >= (long)pv->offset &&
            off < (long)(pv->offset + (size_t)pv->numel))
            return out + pos[v] + (off - (long)pv->offset);
    }
    return NULL;
}

/* Layer view v's values as the model computes with them, into dst: a QLoRA base's dequantized, a
 * bf16-held base's widened (exact), the rest as held. */
static ctrl_status view_values(ctrl_model *m, int v, float *dst) {
    const ctrl_param_view *pv = &m->views[v];
    const int l = view_layer(pv, m->cfg.n_layers);
    if (pv->nf4) return nf4_dequantize_view(m, pv, dst);
    if (m->w16 && l >= 0 && (long)pv->offset >= m->w16_lo[l] &&
        (long)pv->offset < m->w16_lo[m->cfg.n_layers + l])
        MODEL_TRY(model_bf16_layer_weights(m, l)); /* this layer's, widened into its place */
    memcpy(dst, m->params + pv->offset, sizeof(float) * (size_t)pv->numel);
    return CTRL_OK;
}

/* A base held as the bf16 GEMM's panels (model_bf16_store.c: its fp32 pages given back): projection t's
 * weight at offset wo unpacked into W (exact: the panels hold its bf16 values). */
static ctrl_status panel_values(ctrl_model *m, int t, long wo, float *W) {
    int in, out;
    lora_dims(m, t, &in, &out);
    const struct ctrl_cpu_bf16_packed *p = model_pack_valid(m, m->params + wo, in, out);
    if (!p || ctrl_cpu_gemm_bf16_packed_unpack(p, W, in) != 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: a %d x %d base weight held as panels is not readable",
                              out, in);
    return CTRL_OK;
}

/* The merged file, written a layer at a time: each layer's views filled into one buffer and its adapters
 * folded in when the writer first asks for one of them (the views of a layer are one run in the file's
 * name order); the views of no layer written from where the model holds them (a bf16 embedding table
 * as BF16: its values exactly, without a widened copy). So a push holds one layer more, not a model. */
typedef struct {
    ctrl_model *m;
    const char *path;
    size_t *pos; /* view v's place in buf: from its layer's start; 0 for the views of no layer */
    float *buf;  /* the largest layer's views, or the largest view of no layer */
    int layer;   /* whose values buf holds; -1: none */
} merged_writer;

/* m's save_fetch (zero3's streamed push: the view's layer gathered to this rank) for view v. */
static ctrl_status fetched(ctrl_model *m, int v) {
    const ctrl_param_view *pv = &m->views[v];
    return m->save_fetch ? m->save_fetch(m->save_fetch_user, m->params + pv->offset, pv->numel) : CTRL_OK;
}

static ctrl_status merged_layer(merged_writer *w, int l) {
    ctrl_model *m = w->m;
    /* the layer fetched before any of its values are read: its adapters' views and its base's (an NF4
     * view has no fp32 range of its own -- its slot is shared -- so a QLoRA layer is fetched by its
     * adapters', and zero3 gathers the layer's NF4 weights with them) */
    for (int v = 0; v < m->n_views; v++)
        if (!m->views[v].nf4 && view_layer(&m->views[v], m->cfg.n_layers) == l) MODEL_TRY(fetched(m, v));
    for (int v = 0; v < m->n_views; v++)
        if (!m->views[v].lora && view_layer(&m->views[v], m->cfg.n_layers) == l)
            MODEL_TRY(view_values(m, v, w->buf + w->pos[v]));
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        long wo, bias;
        lora_base_weight(m, l, t, &wo, &bias);
        float *W = wo >= 0 ? copy_at(m, w->buf, w->pos, l, wo) : NULL;
        if (wo >= 0 && !W)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: layer %d's weight %d is in no view", w->path, l, t);
        if (W && m->base_panels) MODEL_TRY(panel_values(m, t, wo, W));
        float *Bias = W && bias >= 0 ? copy_at(m, w->buf, w->pos, l, bias) : NULL;
        if (W && m->lora_a[l * LORA_N_TARGETS + t] >= 0) MODEL_TRY(merge_linear(m, l, t, W, Bias));
    }
    float *E = m->layers[l].router >= 0 ? copy_at(m, w->buf, w->pos, l, m->layers[l].experts) : NULL;
    if (E) lora_moe_merge(m, l, E); /* the experts' adapters (target_parameters) */
    w->layer = l;
    return CTRL_OK;
}

static ctrl_status merged_fetch(void *user, const ctrl_st_write *t) {
    merged_writer *w = user;
    ctrl_model *m = w->m;
    int v = 0;
    while (v < m->n_views && m->views[v].name != t->name) v++; /* the writer copies the name pointers */
    if (v == m->n_views) return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: %s is no view", w->path, t->name);
    const int l = view_layer(&m->views[v], m->cfg.n_layers);
    if (l < 0) return t->raw ? CTRL_OK : fetched(m, v); /* written from where the model holds it */
    return l == w->layer ? CTRL_OK : merged_layer(w, l);
}

ctrl_status ctrl_peft_save_merged_weights(ctrl_model *m, const char *path, ctrl_dtype dtype) {
    if (!m->has_lora || m->lora_off) return ctrl_model_save_weights(m, path, dtype);
    if (m->host_stale) MODEL_TRY(ctrl_model_params_to_host(m)); /* a device model: its host copy, current */
    if (lora_tokens_on(m)) { /* the table holding trainable_token_indices' trained rows, as it is written */
        const int off = m->lora_off;
        m->lora_off = 0;
        const ctrl_status st = lora_tokens_sync(m);
        m->lora_off = off;
        MODEL_TRY(st);
    }
    const int n = m->n_views, L = m->cfg.n_layers;
    const uint16_t *table16 = NULL; /* a bf16-held table's values (read out of its panels: a copy) */
    if (ctrl_model_embedding_held_bf16(m)) MODEL_TRY(model_embed16_values(m, &table16));
    merged_writer w = {.m = m, .path = path, .layer = -1, .pos = calloc((size_t)n + 1, sizeof(size_t))};
    size_t *layer_size = calloc((size_t)L + 1, sizeof(size_t)), most = 1;
    ctrl_st_write *tensors = calloc((size_t)n + 1, sizeof *tensors);
    int k = 0;
    for (int v = 0; w.pos && layer_size && tensors && v < n; v++) {
        const ctrl_param_view *pv = &m->views[v];
        if (pv->lora) continue; /* folded into their base weights */
        const int l = view_layer(pv, L);
        if (l >= 0) {
            w.pos[v] = layer_size[l], layer_size[l] += (size_t)pv->numel;
            most = layer_size[l] > most ? layer_size[l] : most;
        }
        ctrl_st_write *t = &tensors[k++];
        *t = (ctrl_st_write){.name = pv->name, .ndim = pv->ndim, .shape = {pv->shape[0], pv->shape[1]}};
        if (table16 && (long)pv->offset == m->off_embed) /* the bf16 table as it is (exact): not widened */
            t->raw = table16, t->raw_dtype = CTRL_BF16;
        else if (l < 0)
            t->data = m->params + pv->offset;
    }
    w.buf = w.pos && layer_size && tensors ? malloc(sizeof(float) * most) : NULL;
    ctrl_status st =
        w.buf ? CTRL_OK
              : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for a layer of the merged weights", path);
    for (int i = 0, v = 0; st == CTRL_OK && v < n; v++) { /* a layer's tensors: where its fetch puts them */
        if (m->views[v].lora) continue;
        if (view_layer(&m->views[v], L) >= 0) tensors[i].data = w.buf + w.pos[v];
        i++;
    }
    if (st == CTRL_OK) st = ctrl_safetensors_write_fetched(path, tensors, k, dtype, merged_fetch, &w);
    free(w.buf), free(w.pos), free(layer_size), free(tensors);
    if (table16 != m->emb16) free((void *)table16);
    return st;
}
