/* The frozen input embedding held as bf16 values alone (LoRA's [peft] embedding_dtype = bf16): what a
 * PEFT user gets from a model loaded with torch_dtype = bfloat16, for the one table that a bf16 LoRA
 * run otherwise keeps in fp32 (at Qwen2.5-0.5B's shape, 151,936 x 896: 519 MiB in fp32, 260 in bf16).
 * As the loader reads model.embed_tokens.weight its values are rounded to bf16 (round to nearest
 * even) into emb16 and the table's fp32 pages are given back. The lookups (the training forward,
 * decoding) widen the rows they gather: the input embeddings are the rounded rows -- the one change
 * in the numbers. An LM head tied to the table (tie_word_embeddings) multiplies by the same bf16
 * values: its products round W to bf16 as they pack it under bf16 compute anyway, so its logits are
 * those of the fp32 table (ctrl_cpu_gemm_w16; the head's args carry w16 with w NULL). Only for a
 * frozen table on the CPU under bf16 compute (the settings refuse the key otherwise; here a trained
 * table -- modules_to_save -- or a device is refused again; under embedding_dtype = auto, the
 * default, such a table simply stays fp32). The head's statistics (the sequence
 * trainers' mean logits, model_head_stats.c) read the same bf16 values. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

static const char *const key = "[peft] embedding_dtype = bf16";

ctrl_status model_embed16_view_loaded(ctrl_model *m, const ctrl_param_view *v) {
    if ((long)v->offset != m->off_embed || m->emb16) return CTRL_OK;
    const int frozen_on_host = m->be->host_memory && m->params == m->dparams && v->offset < m->train_off;
    if (m->emb16_at_load == 2 && !frozen_on_host) return CTRL_OK; /* auto: fp32 where bf16 cannot be */
    if (!m->be->host_memory || m->params != m->dparams)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: the embedding is held in bf16 on the CPU only", key);
    if (v->offset >= m->train_off) /* modules_to_save = embed_tokens (or lm_head tied to it) */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: %s is trained (modules_to_save); only a frozen embedding is held in bf16",
                              key, v->name);
    const size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size;
    if ((size_t)v->numel != n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: %s has %lld values, not %zu", key, v->name,
                              (long long)v->numel, n);
    uint16_t *e = malloc(sizeof(uint16_t) * n);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for %zu values", key, n);
    ctrl_cpu_f32_to_bf16(e, m->params + v->offset, (int64_t)n);
    model_release_range(m, (long)v->offset, (long)(v->offset + n));
    m->emb16 = e;
    return CTRL_OK;
}

ctrl_status model_embed_lookup(ctrl_model *m, float *out, const int32_t *tokens, int T, int C) {
    if (!m->emb16) return m->be->embedding_forward(out, tokens, m->dparams + m->off_embed, T, C);
    ctrl_cpu_embedding_forward_bf16(out, tokens, m->emb16, T, C); /* host memory (checked at load) */
    return CTRL_OK;
}

int model_embed16_holds(const ctrl_model *m, const float *w) {
    return m->emb16 && w == m->dparams + m->off_embed;
}

int ctrl_model_embedding_held_bf16(const ctrl_model *m) { return m->emb16 != NULL; }
