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

ctrl_status ctrl_peft_load(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                           ctrl_model **out) {
    static ctrl_lora_config lc; /* large (the target list): not on the stack */
    *out = NULL;
    MODEL_TRY(ctrl_peft_read_config(adapter_dir, &lc, NULL, 0));
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
    *out = m;
    return CTRL_OK;
}

/* Linear t of layer l folded into W (its base weight [OUT, IN]: in the parameters, or a copy of them):
 * W += s B [OUT, r] A [r, IN] (a fused module's linear has its row block of B); with DoRA each row j then
 * scaled to m_j / ||W_j + s (B A)_j||. */
static void merge_linear(const ctrl_model *m, int l, int t, float *W) {
    const int r = m->lora->r;
    const long ao = m->lora_a[l * LORA_N_TARGETS + t], bo = m->lora_b[l * LORA_N_TARGETS + t];
    int IN, OUT;
    lora_dims(m, t, &IN, &OUT);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OUT, IN, r, m->lora_scale, m->params + bo, r,
                m->params + ao, IN, 1.0f, W, IN);
    const long mo = m->lora_mag ? m->lora_mag[l * LORA_N_TARGETS + t] : -1;
    for (int j = 0; mo >= 0 && j < OUT; j++) {
        float *row = W + (size_t)j * IN;
        double n2 = 0;
        for (int i = 0; i < IN; i++) n2 += (double)row[i] * row[i];
        const float f = m->params[mo + j] / (float)sqrt(n2);
        for (int i = 0; i < IN; i++) row[i] *= f;
    }
}

ctrl_status ctrl_peft_merge(ctrl_model *m) {
    if (!m->has_lora) return ctrl_error_set(CTRL_ERR_RUNTIME, "merge: the model has no LoRA adapters");
    if (m->nf4_w)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "merge: the base is held in NF4 (QLoRA); merge into the full-precision base "
                              "(ctrl model merge --base DIR --adapter DIR)");
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            long w, bias;
            lora_base_weight(m, l, t, &w, &bias);
            if (m->lora_a[l * LORA_N_TARGETS + t] >= 0) merge_linear(m, l, t, m->params + w);
        }
        if (m->layers[l].router >= 0) /* the experts' (target_parameters) */
            lora_moe_merge(m, l, m->params + m->layers[l].experts);
    }
    m->lora_off = 1; /* the adapters are in the weights now */
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

/* View v's values as the model computes with them, into dst: a QLoRA base's dequantized, a bf16-held
 * base's or embedding's widened (exact), the rest as held. */
static ctrl_status view_values(ctrl_model *m, int v, float *dst) {
    const ctrl_param_view *pv = &m->views[v];
    const int l = view_layer(pv, m->cfg.n_layers);
    if (pv->nf4) return nf4_dequantize_view(m, pv, dst);
    if (m->emb16 && (long)pv->offset == m->off_embed) {
        ctrl_cpu_bf16_to_f32(dst, m->emb16, pv->numel);
        return CTRL_OK;
    }
    if (m->w16 && l >= 0 && (long)pv->offset >= m->w16_lo[l] &&
        (long)pv->offset < m->w16_lo[m->cfg.n_layers + l])
        MODEL_TRY(model_bf16_layer_weights(m, l)); /* this layer's, widened into its place */
    memcpy(dst, m->params + pv->offset, sizeof(float) * (size_t)pv->numel);
    return CTRL_OK;
}

ctrl_status ctrl_peft_save_merged_weights(ctrl_model *m, const char *path, ctrl_dtype dtype) {
    if (!m->has_lora || m->lora_off) return ctrl_model_save_weights(m, path, dtype);
    if (m->host_stale) MODEL_TRY(ctrl_model_params_to_host(m)); /* a device model: its host copy, current */
    if (m->base_panels)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: the weights with the adapters merged: the frozen base is held as the bf16 GEMM's "
            "packed panels on this CPU, which are not read back yet (CTRL_NO_BASE_PANELS=1 holds "
            "it as bf16 values)",
            path);
    const int n = m->n_views, L = m->cfg.n_layers;
    size_t *pos = malloc(sizeof(size_t) * (size_t)n), total = 0;
    ctrl_st_write *tensors = calloc((size_t)n, sizeof *tensors);
    for (int v = 0; pos && v < n; v++)
        if (!m->views[v].lora) pos[v] = total, total += (size_t)m->views[v].numel;
    float *out = pos && tensors ? malloc(sizeof(float) * (total ? total : 1)) : NULL;
    ctrl_status st =
        out ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the merged weights", path);
    int k = 0;
    for (int v = 0; st == CTRL_OK && v < n; v++) {
        const ctrl_param_view *pv = &m->views[v];
        if (pv->lora) continue; /* folded into their base weights below */
        st = view_values(m, v, out + pos[v]);
        tensors[k++] = (ctrl_st_write){
            .name = pv->name, .data = out + pos[v], .ndim = pv->ndim, .shape = {pv->shape[0], pv->shape[1]}};
    }
    for (int l = 0; st == CTRL_OK && l < L; l++) {
        for (int t = 0; st == CTRL_OK && t < LORA_N_TARGETS; t++) {
            long w, bias;
            lora_base_weight(m, l, t, &w, &bias);
            if (m->lora_a[l * LORA_N_TARGETS + t] < 0) continue;
            float *W = copy_at(m, out, pos, l, w);
            if (W)
                merge_linear(m, l, t, W);
            else
                st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: layer %d's weight %d is in no view", path, l, t);
        }
        float *E = m->layers[l].router >= 0 ? copy_at(m, out, pos, l, m->layers[l].experts) : NULL;
        if (E) lora_moe_merge(m, l, E);
    }
    if (st == CTRL_OK) st = ctrl_safetensors_write(path, tensors, k, dtype);
    free(out), free(tensors), free(pos);
    return st;
}
