/* Adapters in and out of a model in one call (ctrl_peft_load), and folded into the base weights
 * (ctrl_peft_merge: PEFT's merge_and_unload): W += s * B A for every adapter, on the host copy;
 * with DoRA then each row j scaled by magnitude_j / ||row j|| (the norm of the unmerged W + s B A,
 * as PEFT's DoRA merge computes it). */
#include <cblas.h>
#include <math.h>

#include "model/model_internal.h"
#include "model/peft.h"

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

ctrl_status ctrl_peft_merge(ctrl_model *m) {
    if (!m->has_lora) return ctrl_error_set(CTRL_ERR_RUNTIME, "merge: the model has no LoRA adapters");
    if (m->nf4_w)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "merge: the base is held in NF4 (QLoRA); merge into the full-precision base "
                              "(ctrl model merge --base DIR --adapter DIR)");
    const int r = m->lora->r;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            const long ao = m->lora_a[l * LORA_N_TARGETS + t], bo = m->lora_b[l * LORA_N_TARGETS + t];
            if (ao < 0) continue;
            int IN, OUT; /* A [r, IN], B [OUT, r]: a fused module's linear has its row block of B */
            lora_dims(m, t, &IN, &OUT);
            const layer_offsets *o = &m->layers[l];
            const long w[LORA_N_TARGETS] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
            /* W [OUT, IN] += s * B [OUT, r] A [r, IN] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OUT, IN, r, m->lora_scale, m->params + bo,
                        r, m->params + ao, IN, 1.0f, m->params + w[t], IN);
            const long mo = m->lora_mag ? m->lora_mag[l * LORA_N_TARGETS + t] : -1;
            for (int j = 0; mo >= 0 && j < OUT;
                 j++) { /* DoRA: W_j = m_j / ||W_j + s (B A)_j|| (W_j + s (B A)_j) */
                float *row = m->params + w[t] + (size_t)j * IN;
                double n2 = 0;
                for (int i = 0; i < IN; i++) n2 += (double)row[i] * row[i];
                const float f = m->params[mo + j] / (float)sqrt(n2);
                for (int i = 0; i < IN; i++) row[i] *= f;
            }
        }
    lora_moe_merge(m); /* the experts' (target_parameters) */
    m->lora_off = 1;   /* the adapters are in the weights now */
    ctrl_model_weights_changed(m);
    return CTRL_OK;
}
