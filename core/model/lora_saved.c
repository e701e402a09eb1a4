/* PEFT's disable_adapter() for modules_to_save: with the adapters off a ModulesToSaveWrapper runs the
 * original module, not its trained copy, so a LoRA run's reference model (DPO's, KTO's, the online
 * trainers' KL) sees the base's embedding and LM head even where they are trained in full. The model
 * holds one copy of each such table (the trainable view); the base's values are kept aside as the table
 * loads, and the two are swapped before a forward whenever the adapters were switched (lazily when they
 * go off, at once when they come back on, so that the trainable view holds the trained values whenever
 * the adapters are on: optimizer steps, saves and checkpoints read it then). A merged model keeps the
 * trained tables (merge_and_unload). On a device the swap partner is a copy of the base's values there,
 * uploaded again when the host's parameters replace the device's. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

void lora_saved_layout(ctrl_model *m) {
    memset(m->saved, 0, sizeof m->saved);
    m->saved_off = 0;
    const size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size;
    if (!m->has_lora || m->cfg.num_labels > 0) return; /* (a classifier's score has no base: a new head) */
    if ((size_t)m->off_embed >= m->train_off)
        m->saved[0] = (struct lora_saved_table){.table = m->off_embed, .n = n};
    if (m->off_lm_head >= 0 && m->off_lm_head != m->off_embed && (size_t)m->off_lm_head >= m->train_off)
        m->saved[1] = (struct lora_saved_table){.table = m->off_lm_head, .n = n};
}

void lora_saved_capture(ctrl_model *m, long table) {
    for (int k = 0; k < 2; k++) {
        struct lora_saved_table *s = &m->saved[k];
        if (!s->n || (table >= 0 && table != s->table)) continue;
        if (!s->orig && !(s->orig = malloc(sizeof(float) * s->n))) continue; /* (refused at the first sync) */
        memcpy(s->orig, m->params + s->table, sizeof(float) * s->n);
        s->captured = 1, s->orig_dev_valid = 0;
    }
}

/* Table k's values exchanged with its partner (the host's copy, or the backend's), in chunks through a
 * small scratch on a device. */
static ctrl_status swap(ctrl_model *m, struct lora_saved_table *s) {
    const ctrl_backend_ops *be = m->be;
    float *t = m->dparams + s->table;
    if (be->host_memory) {
        for (size_t i = 0; i < s->n; i++) {
            const float x = t[i];
            t[i] = s->orig[i], s->orig[i] = x;
        }
        return CTRL_OK;
    }
    if (!s->orig_dev) MODEL_TRY(be->alloc((void **)&s->orig_dev, sizeof(float) * s->n));
    if (!s->orig_dev_valid) MODEL_TRY(be->to_device(s->orig_dev, s->orig, sizeof(float) * s->n));
    s->orig_dev_valid = 1;
    const size_t chunk = (size_t)1 << 20;
    float *tmp = NULL;
    MODEL_TRY(be->alloc((void **)&tmp, sizeof(float) * (s->n < chunk ? s->n : chunk)));
    ctrl_status st = CTRL_OK;
    for (size_t i = 0; i < s->n && st == CTRL_OK; i += chunk) {
        const size_t b = sizeof(float) * (s->n - i < chunk ? s->n - i : chunk);
        st = be->copy(tmp, t + i, b);
        if (st == CTRL_OK) st = be->copy(t + i, s->orig_dev + i, b);
        if (st == CTRL_OK) st = be->copy(s->orig_dev + i, tmp, b);
    }
    be->free(tmp);
    return st;
}

ctrl_status lora_saved_sync(ctrl_model *m) {
    const int want = m->lora_off && !m->lora_merged; /* the base's values: adapters off, not merged */
    if (want == m->saved_off) return CTRL_OK;
    for (int k = 0; k < 2; k++) {
        struct lora_saved_table *s = &m->saved[k];
        if (!s->n) continue;
        if (m->dparams_sliced || m->shard_outer) /* zero3: this rank holds a slice of the table */
            return ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "LoRA: the adapters switched off with modules_to_save under zero3 (the base's "
                "table beside the trained one on sliced parameters is not implemented)");
        if (!s->captured)
            return ctrl_error_set(CTRL_ERR_RUNTIME,
                                  "LoRA: the base's values of a modules_to_save table were never read (no "
                                  "weights set, or no memory for their copy)");
        MODEL_TRY(swap(m, s));
        MODEL_TRY(ctrl_model_params_range_changed(m, (size_t)s->table, s->n)); /* bf16 copies, panels */
    }
    m->saved_off = want;
    return CTRL_OK;
}

void lora_saved_release(ctrl_model *m) {
    const int off = m->lora_off; /* the trained values back in the table before the backend's copy goes */
    m->lora_off = 0;
    if (m->saved_off && lora_saved_sync(m) != CTRL_OK) ctrl_error_clear();
    m->lora_off = off;
    for (int k = 0; k < 2; k++) {
        if (m->saved[k].orig_dev && m->be) m->be->free(m->saved[k].orig_dev);
        m->saved[k].orig_dev = NULL, m->saved[k].orig_dev_valid = 0;
    }
}

void lora_saved_uploaded(ctrl_model *m) {
    m->saved_off = 0; /* the host's parameters (the trained values) replaced the device's */
    for (int k = 0; k < 2; k++) m->saved[k].orig_dev_valid = 0;
}

void lora_saved_free(ctrl_model *m) {
    for (int k = 0; k < 2; k++) free(m->saved[k].orig), m->saved[k].orig = NULL;
}
