/* The frozen input embedding held in bf16 (LoRA's [peft] embedding_dtype = bf16, or auto): what a PEFT
 * user gets from a model loaded with torch_dtype = bfloat16, for the one table that a bf16 LoRA run
 * otherwise keeps in fp32 (at Qwen2.5-0.5B's shape, 151,936 x 896: 519 MiB in fp32, 260 in bf16). As
 * the loader reads model.embed_tokens.weight its values are rounded to bf16 (round to nearest even)
 * and the table's fp32 pages are given back. Two forms, the same numbers:
 *   - bf16 values (emb16 [V, C]): the lookups widen the rows they gather; an LM head tied to the table
 *     multiplies by the same values (ctrl_cpu_gemm_w16, rounding x as bf16 products do; the head's args
 *     carry w16 with w NULL), its logits those of the fp32 table;
 *   - where the head is tied and a bf16 GEMM kernel runs (AVX-512 BF16, AMX): the head's panels alone
 *     (emb_panels, a held entry of the panel table, model_decode_pack.c): the lookups widen rows out
 *     of the panels (ctrl_cpu_gemm_bf16_packed_rows), the head multiplies by them in every product --
 *     the training head chunk by chunk of the vocabulary (ctrl_cpu_gemm_bf16_packed_cols), decoding's
 *     head without packing it again in each step. From bf16 values decoding packs the tied head in
 *     every step (+55% of a decoding run's CPU, docs/performance.md), so a loop that decodes (auto:
 *     emb16_at_load 3) holds a tied table as panels or not at all. CTRL_NO_EMBED_PANELS=1 keeps the
 *     values form (for comparisons).
 * The input embeddings are the rounded rows -- the one change in the numbers. Inference (ctrl generate
 * --dtype bf16, a model loaded frozen in bf16: emb16_at_load 4; or held after its load,
 * model_embed16_hold_exact) holds the table only where its values are bf16 already (a checkpoint stored in
 * bf16, as Qwen's and Llama's are): no change at all, and half (untied: as values) or all (tied: as the
 * head's panels, which it holds anyway) of the table's fp32 memory saved. Only for a frozen table on the CPU
 * under bf16 compute (the settings refuse the key otherwise; here a trained table -- modules_to_save -- or a
 * device is refused again; under auto such a table simply stays fp32). The head's statistics (the sequence
 * trainers' mean logits, model_head_stats.c) read the same bf16 values. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

static const char *const key = "[peft] embedding_dtype = bf16";

/* Whether every value of x[n] is a bf16 value (its low 16 bits zero): a checkpoint stored in bf16. */
static int bf16_exact(const float *x, size_t n) {
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t any = 0;
#pragma omp parallel for reduction(| : any) schedule(static)
    for (size_t i = 0; i < n; i++) any |= u[i] & 0xFFFFu;
    return any == 0;
}

/* Whether the table can be held as the tied head's panels. */
static int as_panels(const ctrl_model *m) {
    const char *off = getenv("CTRL_NO_EMBED_PANELS");
    return m->off_lm_head == m->off_embed && ctrl_cpu_gemm_bf16_pack_bytes(16, 16) != 0 &&
           !(off && *off && strcmp(off, "0") != 0);
}

ctrl_status model_embed16_view_loaded(ctrl_model *m, const ctrl_param_view *v) {
    if ((long)v->offset != m->off_embed || m->emb16 || m->emb_panels) return CTRL_OK;
    const int trained_rows = lora_tokens_in(m, m->off_embed);  /* trainable_token_indices (lora_tokens.c) */
    if (trained_rows && m->emb16_at_load >= 2) return CTRL_OK; /* auto: rows of it trained, fp32 */
    if (trained_rows)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: trainable_token_indices trains rows of the table; only a frozen embedding "
                              "is held in bf16",
                              key);
    const int frozen_on_host = m->be->host_memory && m->params == m->dparams && v->offset < m->train_off;
    if (m->emb16_at_load >= 2 && !frozen_on_host) return CTRL_OK; /* auto: fp32 where bf16 cannot be */
    if (!m->be->host_memory || m->params != m->dparams)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: the embedding is held in bf16 on the CPU only", key);
    if (v->offset >= m->train_off) /* modules_to_save = embed_tokens (or lm_head tied to it) */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: %s is trained (modules_to_save); only a frozen embedding is held in bf16",
                              key, v->name);
    const int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    const size_t n = (size_t)V * (size_t)C;
    if ((size_t)v->numel != n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: %s has %lld values, not %zu", key, v->name,
                              (long long)v->numel, n);
    if (m->emb16_at_load == 4 && !bf16_exact(m->params + v->offset, n)) return CTRL_OK; /* inference: exact */
    if (as_panels(m)) {
        MODEL_TRY(model_pack_hold(m, v->offset, C, V));
        m->emb_panels = model_pack_valid(m, m->params + v->offset, C, V);
        model_release_range(m, (long)v->offset, (long)(v->offset + n));
        return CTRL_OK;
    }
    /* tied, in a loop that decodes: from bf16 values decoding would pack the head in every step */
    if (m->emb16_at_load >= 3 && m->off_lm_head == m->off_embed) return CTRL_OK;
    uint16_t *e = malloc(sizeof(uint16_t) * n);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for %zu values", key, n);
    ctrl_cpu_f32_to_bf16(e, m->params + v->offset, (int64_t)n);
    model_release_range(m, (long)v->offset, (long)(v->offset + n));
    m->emb16 = e;
    return CTRL_OK;
}

ctrl_status model_embed16_rows(const ctrl_model *m, const int32_t *rows, int n, float *out) {
    if (m->emb16) {
        ctrl_cpu_embedding_forward_bf16(out, rows, m->emb16, n, m->cfg.hidden_size);
        return CTRL_OK;
    }
    if (!m->emb_panels ||
        ctrl_cpu_gemm_bf16_packed_rows(m->emb_panels, rows, n, out, m->cfg.hidden_size) != 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: a token outside the vocabulary (%d entries)",
                              m->cfg.vocab_size);
    return CTRL_OK;
}

ctrl_status model_embed_lookup(ctrl_model *m, float *out, const int32_t *tokens, int T, int C) {
    if (!m->emb16 && !m->emb_panels)
        return m->be->embedding_forward(out, tokens, m->dparams + m->off_embed, T, C);
    return model_embed16_rows(m, tokens, T, out); /* host memory (checked at load) */
}

int model_embed16_holds(const ctrl_model *m, const float *w) {
    return (m->emb16 || m->emb_panels) && w == m->dparams + m->off_embed;
}

int model_embed16_chunk(const ctrl_model *m) {
    return m->emb_panels ? ctrl_cpu_gemm_bf16_packed_block(m->emb_panels) : 0;
}

static ctrl_status no_product(void) {
    return ctrl_error_set(
        CTRL_ERR_UNSUPPORTED,
        "model: the embedding is held as the bf16 GEMM's panels and no bf16 kernel runs now "
        "(switched off after loading?), or no memory for the LM head's product");
}

ctrl_status model_embed16_forward(const ctrl_model *m, float *out, int ldo, const float *x, int T, int v0,
                                  int vc, int bf16) {
    const int C = m->cfg.hidden_size;
    if (m->emb_panels)
        return ctrl_cpu_gemm_bf16_packed_cols(0, T, x, C, m->emb_panels, v0, vc, out, ldo, 0) == 0
                   ? CTRL_OK
                   : no_product();
    if (ctrl_cpu_gemm_w16(0, 1, T, vc, C, 1.0f, x, C, m->emb16 + (size_t)v0 * C, C, out, ldo, 0, bf16) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory for the LM head's product");
    return CTRL_OK;
}

ctrl_status model_embed16_backward(const ctrl_model *m, float *dx, const float *dout, int T, int bf16) {
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (m->emb_panels)
        return ctrl_cpu_gemm_bf16_packed_t(0, T, dout, V, m->emb_panels, dx, C, 0) == 0 ? CTRL_OK
                                                                                        : no_product();
    if (ctrl_cpu_gemm_w16(0, 0, T, C, V, 1.0f, dout, V, m->emb16, C, dx, C, 0, bf16) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory for the LM head's product");
    return CTRL_OK;
}

ctrl_status model_embed16_values(const ctrl_model *m, const uint16_t **out) {
    *out = m->emb16;
    if (m->emb16 || !m->emb_panels) return CTRL_OK;
    const int V = m->cfg.vocab_size, C = m->cfg.hidden_size, R = 1024;
    uint16_t *e = malloc(sizeof(uint16_t) * (size_t)V * C);
    float *rows = malloc(sizeof(float) * (size_t)R * C);
    int32_t *idx = malloc(sizeof(int32_t) * R);
    ctrl_status st =
        e && rows && idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "model: the embedding's values");
    for (int r0 = 0; st == CTRL_OK && r0 < V; r0 += R) { /* a block of rows widened, then narrowed (exact) */
        const int n = V - r0 < R ? V - r0 : R;
        for (int i = 0; i < n; i++) idx[i] = r0 + i;
        st = model_embed16_rows(m, idx, n, rows);
        if (st == CTRL_OK) ctrl_cpu_f32_to_bf16(e + (size_t)r0 * C, rows, (int64_t)n * C);
    }
    free(rows), free(idx);
    if (st != CTRL_OK) free(e), e = NULL;
    *out = e;
    return st;
}

ctrl_status model_embed16_hold_exact(ctrl_model *m) {
    const size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size, off = (size_t)m->off_embed;
    if (m->off_embed < 0 || m->emb16 || m->emb_panels || off >= m->train_off || !m->be->host_memory ||
        m->params != m->dparams || !bf16_exact(m->params + off, n))
        return CTRL_OK;
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (m->off_lm_head == m->off_embed) { /* tied: the head's held panels, where it has them, are the table */
        if (!as_panels(m) || !(m->emb_panels = model_pack_held(m, off, C, V))) return CTRL_OK;
    } else if (!(m->emb16 = malloc(sizeof(uint16_t) * n))) {
        return CTRL_OK; /* (no memory for the smaller copy: the fp32 table stays) */
    } else {
        ctrl_cpu_f32_to_bf16(m->emb16, m->params + off, (int64_t)n);
    }
    model_release_range(m, (long)off, (long)(off + n));
    return CTRL_OK;
}

ctrl_status model_embed16_write(ctrl_model *m, const float *x) {
    const size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size, off = (size_t)m->off_embed;
    if (bf16_exact(x, n)) { /* still bf16 values: held as before */
        if (m->emb16) ctrl_cpu_f32_to_bf16(m->emb16, x, (int64_t)n);
        if (m->emb_panels && model_pack_rewrite(m, off, off + n, x) != 1) return no_product();
        return CTRL_OK;
    }
    memcpy(m->params + off, x, sizeof(float) * n); /* the lookups read fp32 again, exactly */
    free(m->emb16);
    m->emb16 = NULL;
    if (m->emb_panels && model_pack_rewrite(m, off, off + n, x) != 1) /* (the tied head's, held still) */
        return no_product();
    m->emb_panels = NULL;
    return CTRL_OK;
}

int ctrl_model_embedding_held_bf16(const ctrl_model *m) { return m->emb_panels ? 2 : m->emb16 ? 1 : 0; }
