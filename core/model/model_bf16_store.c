/* A frozen model held in bf16 (ctrl_model_hold_bf16; a distillation teacher with [teacher] dtype =
 * bf16): every parameter is rounded to bf16 once, each layer's weights are kept as 2-byte bf16
 * values (w16) and their fp32 pages are given back to the system (madvise MADV_DONTNEED: the pages
 * read as zeros and hold no memory until written again). Before a layer runs (forward or decode,
 * model_layer_forward) its weights are widened back into their fp32 place, and the previously
 * widened layer's pages are given back: one layer in fp32 at a time. The widened layer's pages are
 * borrowed from a one-frame pool (core/page_pool.h: its pages moved onto the layer's range with
 * mremap and moved back at the next widening), so that widening writes resident memory instead of
 * faulting and zeroing ~60 MB of fresh pages a layer (Qwen2.5-0.5B's shape), twice a layer a training
 * step (the forward's; the backward's, for the recompute and dX); where the pool cannot lend (mremap
 * refused, no memory for the frame, CTRL_TEST_BF16_REFAULT set) the layer's pages are given back with
 * madvise and faulted again, as before. The numbers are the same either way: every value of the
 * layer's range is written. The embeddings, the final norm and the LM head stay fp32 (rounded to bf16
 * values). The layout does not change: the views, offsets and kernels see the same fp32 parameters,
 * which the linear projections take as bf16 values (no rounded copy is made).
 *
 * Under LoRA with bf16 compute (ctrl_model_hold_base_bf16: the frozen base of an adapter run) only
 * the layers' projection weights are rounded: bf16 compute multiplies them as bf16 values anyway, so
 * the numbers do not change. The layers' norms and biases (1-D views) keep their fp32 values in a
 * small side copy (w16_keep) put back after each widening; the embeddings, final norm, LM head, the
 * modules_to_save and the adapters (all outside the layers' ranges) are untouched. The backward
 * widens each layer again, in reverse order (model_backward.c).
 *
 * Where a bf16 GEMM kernel runs (AVX-512 BF16, AMX) the LoRA base is held as the GEMM's panels
 * instead (base_panels): each projection weight of a layer is packed once, as the layer finishes
 * loading, into a held entry of the model's panel table (model_decode_pack.c), the layer's fp32
 * pages are given back and its norms and biases written back into place, where they stay. Nothing
 * is widened: the forward (x W^T), the backward's dX (dY W, the same panels read transposed) and
 * decoding multiply by the panels, which are the weights' only copy (about 2 bytes a weight: the
 * panels pad each weight's rows to the kernel's panel width). The products are bit for bit those
 * of the 2-byte store (the same bf16 values, the same blocked GEMM).
 *
 * For inference (ctrl_model_hold_panels: ctrl generate --dtype bf16) the same panels hold a LoRA
 * model's base or a model frozen whole, and the LM head's panels are held too: decoding then packs
 * nothing. A head of its own in a model frozen whole is then only its panels (its fp32 pages given
 * back); a tied one keeps the embedding's fp32 values for the lookups unless the table is held in bf16
 * (model_embed16.c: as it loads, or here where its values are bf16 ones already). Only as panels: where
 * none can be made the model is left as it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"
#include "page_pool.h"

static int getenv_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

void model_release_range(ctrl_model *m, long lo, long hi) { page_release(m->params + lo, m->params + hi); }

/* Whether view pv lies in a layer's range (lo: [L] starts, then [L] ends). */
static int in_layers(const long *lo, int L, const ctrl_param_view *pv) {
    for (int l = 0; l < L; l++)
        if ((long)pv->offset >= lo[l] && (long)pv->offset < lo[L + l]) return 1;
    return 0;
}

/* A layer's 1-D view (a norm or a bias): kept exact under LoRA. */
static int kept_fp32(const ctrl_param_view *pv) { return pv->ndim == 1; }

/* Copies layer l's norms and biases between params and the side copy (to_keep: into it). */
static void keep_layer(ctrl_model *m, int l, int to_keep) {
    const long *lo = m->w16_lo;
    const int L = m->cfg.n_layers;
    long k = 0;
    for (int v = 0; v < m->n_views; v++) {
        const ctrl_param_view *pv = &m->views[v];
        if (!in_layers(lo, L, pv) || !kept_fp32(pv)) continue;
        if ((long)pv->offset >= lo[l] && (long)pv->offset < lo[L + l]) {
            float *p = m->params + pv->offset, *kp = m->w16_keep + k;
            memcpy(to_keep ? kp : p, to_keep ? p : kp, sizeof(float) * (size_t)pv->numel);
        }
        k += pv->numel;
    }
}

/* Where layer l's weights start in w16. */
static long w16_at(const ctrl_model *m, int l) {
    long at = 0;
    for (int k = 0; k < l; k++) at += m->w16_lo[m->cfg.n_layers + k] - m->w16_lo[k];
    return at;
}

/* Layer l into its bf16 store: its norms and biases aside (under LoRA), its weights rounded in
 * place, narrowed into w16 and their fp32 pages given back; or (base_panels) its projections packed
 * into held panels, the pages given back and the norms and biases put back for good. */
static ctrl_status pack_layer(ctrl_model *m, int l) {
    const long lo = m->w16_lo[l], hi = m->w16_lo[m->cfg.n_layers + l];
    if (m->w16_keep) keep_layer(m, l, 1);
    if (m->base_panels) {
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            long w, bias;
            int in, out;
            lora_base_weight(m, l, t, &w, &bias);
            lora_dims(m, t, &in, &out);
            if (w >= 0) MODEL_TRY(model_pack_hold(m, (size_t)w, in, out));
        }
        model_release_range(m, lo, hi);
        keep_layer(m, l, 0);
        return CTRL_OK;
    }
    ctrl_cpu_round_to_bf16(m->params + lo, m->params + lo, hi - lo);
    ctrl_cpu_f32_to_bf16(m->w16 + w16_at(m, l), m->params + lo, hi - lo); /* exact: already bf16 values */
    model_release_range(m, lo, hi);
    return CTRL_OK;
}

/* Whether the base can be held as panels: a bf16 GEMM kernel runs now and every 2-D weight of the
 * layers is covered by the projections the layer code multiplies by (lora_base_weight: q, k, v, o,
 * gate, up, down, each inside one weight -- Phi-3's fused ones hold two or three); *n: their values. */
static int panels_fit(const ctrl_model *m, long *n) {
    *n = 0;
    if (ctrl_cpu_gemm_bf16_pack_bytes(16, 16) == 0) return 0;
    const int L = m->cfg.n_layers;
    long in2d = 0;
    for (int v = 0; v < m->n_views; v++) {
        const ctrl_param_view *pv = &m->views[v];
        if (pv->ndim == 2 && pv->offset < m->train_off && in_layers(m->w16_lo, L, pv)) in2d += pv->numel;
    }
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            long w, bias;
            int in, out;
            lora_base_weight(m, l, t, &w, &bias);
            lora_dims(m, t, &in, &out);
            if (w < 0) continue;
            int inside = 0; /* within one 2-D view of layer l */
            for (int v = 0; v < m->n_views && !inside; v++) {
                const ctrl_param_view *pv = &m->views[v];
                inside = pv->ndim == 2 && w >= (long)pv->offset &&
                         w + (long)in * out <= (long)(pv->offset + (size_t)pv->numel) && w >= m->w16_lo[l] &&
                         w < m->w16_lo[L + l];
            }
            if (!inside) return 0;
            *n += (long)in * out;
        }
    return *n == in2d;
}

/* The bf16 store's layout and buffers (nothing packed yet). base_only: the frozen base under LoRA, or
 * of a model frozen whole (the projections rounded, the norms and biases kept); otherwise a frozen
 * model, all of it rounded. panels_only: held as panels or not at all (CTRL_ERR_UNSUPPORTED, the
 * model unchanged). */
static ctrl_status begin(ctrl_model *m, int base_only, int panels_only) {
    if (!m->be->host_memory || m->params != m->dparams)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: bf16 storage is for a model computing on the CPU");
    const int L = m->cfg.n_layers;
    long *lo = malloc(sizeof(long) * (size_t)(2 * L + 1));
    if (!lo) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    long *hi = lo + L;
    for (int l = 0; l < L; l++) lo[l] = -1, hi[l] = -1;
    long total = 0, kept = 0;
    for (int v = 0; v < m->n_views; v++) {
        const ctrl_param_view *pv = &m->views[v];
        int l = -1, n = 0;
        if (sscanf(pv->name, "model.layers.%d.%n", &l, &n) != 1 || n == 0 || l < 0 || l >= L) continue;
        if (base_only && pv->offset >= m->train_off) continue; /* an adapter: trained, fp32 */
        const long off = (long)pv->offset, end = off + (long)pv->numel;
        if (lo[l] < 0 || off < lo[l]) lo[l] = off;
        if (end > hi[l]) hi[l] = end;
        total += pv->numel;
        if (base_only && kept_fp32(pv)) kept += pv->numel;
    }
    long sum = 0; /* every layer one contiguous range of its own views (model.c's layout) */
    for (int l = 0; l < L; l++) sum += hi[l] - lo[l];
    if (sum != total || L == 0) {
        free(lo);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: the layers' weights are not contiguous; kept in fp32");
    }
    if (base_only && hi[L - 1] > (long)m->train_off) { /* the adapters come after the base */
        free(lo);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: trainable weights inside the layers; kept in fp32");
    }
    m->w16_lo = lo; /* (panels_fit reads the layers' ranges) */
    long in_panels = 0;
    const int panels = base_only && !getenv_flag("CTRL_NO_BASE_PANELS") && panels_fit(m, &in_panels);
    if (panels_only && !panels) {
        free(lo);
        m->w16_lo = NULL;
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            ctrl_cpu_gemm_bf16_pack_bytes(16, 16) == 0
                ? "model: no bf16 GEMM kernel runs here (AVX-512 BF16 or AMX: absent, or switched off)"
            : getenv_flag("CTRL_NO_BASE_PANELS")
                ? "model: CTRL_NO_BASE_PANELS is set"
                : "model: the layers hold weights that are not linear projections");
    }
    uint16_t *w16 = panels ? NULL : malloc(sizeof(uint16_t) * (size_t)(total > 0 ? total : 1));
    ctrl_advise_huge_pages(w16, sizeof(uint16_t) * (size_t)(total > 0 ? total : 1));
    float *keep = base_only ? malloc(sizeof(float) * (size_t)(kept > 0 ? kept : 1)) : NULL;
    long *loaded = base_only ? calloc((size_t)L, sizeof(long)) : NULL;
    if ((!panels && !w16) || (base_only && (!keep || !loaded))) {
        free(lo), free(w16), free(keep), free(loaded);
        m->w16_lo = NULL;
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: the bf16 copy of %ld weights", total);
    }
    /* the widened layer's pages: one frame of the largest layer's */
    if (!panels && !getenv("CTRL_TEST_BF16_REFAULT")) {
        size_t frame = 0;
        for (int l = 0; l < L; l++) {
            const page_piece pc = page_span(m->params + lo[l], m->params + hi[l]);
            frame = pc.len > frame ? pc.len : frame;
        }
        m->w16_pool = page_pool_new(1, frame, 1, L); /* NULL: the old way */
    }
    m->w16 = w16, m->w16_lo = lo, m->w16_layer = -1, m->w16_keep = keep,
    m->w16_n = panels ? in_panels : total;
    m->w16_loaded = loaded, m->base_panels = panels;
    m->rounded_valid = 0;
    return CTRL_OK;
}

static ctrl_status hold(ctrl_model *m, int base_only, int panels_only) {
    MODEL_TRY(begin(m, base_only, panels_only));
    if (!base_only) ctrl_cpu_round_to_bf16(m->params, m->params, (int64_t)m->n_params);
    for (int l = 0; l < m->cfg.n_layers; l++) MODEL_TRY(pack_layer(m, l));
    return CTRL_OK;
}

ctrl_status ctrl_model_hold_bf16(ctrl_model *m) {
    if (m->n_train != 0 || m->has_lora || m->nf4_w)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: only a frozen model without adapters is held in bf16");
    return hold(m, 0, 0);
}

/* Why the frozen base of model m -- under LoRA, or (frozen_whole) a model frozen whole
 * (ctrl_model_freeze) -- cannot be held in bf16 (CTRL_OK: it can). */
static ctrl_status base_holdable(const ctrl_model *m, int frozen_whole) {
    if (m->w16 || m->base_panels ||
        (frozen_whole ? m->has_lora || m->n_train != 0 : !m->has_lora || !m->lora))
        return ctrl_error_set(CTRL_ERR_RUNTIME, frozen_whole
                                                    ? "model: a frozen model without adapters is held once"
                                                    : "model: the base is held in bf16 once, under LoRA");
    if (!frozen_whole && m->lora->nf4)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: the base is in NF4 (QLoRA); kept as it is");
    if (!frozen_whole && m->lora->use_dora) /* DoRA's weight norms read the fp32 base weights */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: DoRA's weight norms need the fp32 base");
    if (m->cfg.n_experts > 0) /* the experts' GEMMs and the router are not model_linear_* products */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: a mixture of experts' base is kept in fp32");
    return CTRL_OK;
}

ctrl_status ctrl_model_hold_base_bf16(ctrl_model *m) {
    if (!m->linear_bf16) /* fp32 compute multiplies the fp32 weights: rounding them would change it */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: the base is held in bf16 only with bf16 compute");
    MODEL_TRY(base_holdable(m, 0));
    return hold(m, 1, 0);
}

ctrl_status ctrl_model_hold_panels(ctrl_model *m) {
    if (!m->linear_bf16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: held as panels only with bf16 compute");
    MODEL_TRY(base_holdable(m, !m->has_lora));
    MODEL_TRY(hold(m, 1, 1));
    MODEL_TRY(model_hold_head(m));
    return model_embed16_hold_exact(m); /* (a checkpoint stored in bf16: its table too) */
}

ctrl_status model_hold_head(ctrl_model *m) {
    if (m->off_lm_head < 0) return CTRL_OK;
    /* where it trains no more (its fp32 values stay: the embedding's when tied) */
    if (m->has_lora && (size_t)m->off_lm_head >= m->train_off) return CTRL_OK;
    /* nor rows of it (trainable_token_indices: written into it as the adapters go on and off; decoding's
     * panels of it are packed again when they change) */
    if (lora_tokens_in(m, m->off_lm_head)) return CTRL_OK;
    const size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size;
    MODEL_TRY(model_pack_hold(m, (size_t)m->off_lm_head, m->cfg.hidden_size, m->cfg.vocab_size));
    /* a model frozen whole with a head of its own: decoding reads only the panels; its fp32 pages back */
    if (!m->has_lora && m->off_lm_head != m->off_embed && !m->head_held_only) {
        model_release_range(m, m->off_lm_head, (long)(m->off_lm_head + n));
        m->head_held_only = 1;
    }
    return CTRL_OK;
}

ctrl_status model_bf16_view_loaded(ctrl_model *m, const ctrl_param_view *v) {
    if (!m->w16_lo) {
        /* kept in fp32 where it cannot be held: the caller logs why */
        /* a model frozen whole (ctrl_model_load_frozen_bf16), or an adapter's base for inference
         * (ctrl_peft_load_bf16; w16_at_load 2): panels only */
        const int whole = !m->has_lora;
        if (base_holdable(m, whole) != CTRL_OK || begin(m, 1, whole || m->w16_at_load == 2) != CTRL_OK) {
            ctrl_error_clear();
            m->w16_at_load = 0;
            return CTRL_OK;
        }
    }
    const int L = m->cfg.n_layers;
    for (int l = 0; l < L && m->w16_loaded; l++)
        if ((long)v->offset >= m->w16_lo[l] && (long)v->offset < m->w16_lo[L + l]) {
            m->w16_loaded[l] += v->numel;
            if (m->w16_loaded[l] == m->w16_lo[L + l] - m->w16_lo[l])
                return pack_layer(m, l); /* the whole layer read */
            break;
        }
    return CTRL_OK;
}

ctrl_status ctrl_model_write_view(ctrl_model *m, const ctrl_param_view *v, const float *x) {
    const size_t lo = v->offset, hi = lo + (size_t)v->numel;
    if ((long)lo == m->off_embed && ctrl_model_embedding_held_bf16(m)) return model_embed16_write(m, x);
    const int L = m->cfg.n_layers;
    if (m->w16 && in_layers(m->w16_lo, L, v))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: %s is held in the 2-byte bf16 store", v->name);
    const int packed = model_pack_rewrite(m, lo, hi, x); /* a held weight's panels */
    if (packed < 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: %s is held as bf16 panels and no bf16 kernel runs now", v->name);
    /* the fp32 values too, unless their pages were given back (a held projection, an untied head) */
    const int given_back = packed > 0 && ((m->base_panels && in_layers(m->w16_lo, L, v)) ||
                                          ((long)lo == m->off_lm_head && m->head_held_only));
    if (!given_back) memcpy(m->params + lo, x, sizeof(float) * (size_t)v->numel);
    return CTRL_OK;
}

void ctrl_model_held_summary(const ctrl_model *m, char *buf, size_t cap) {
    const int table = ctrl_model_embedding_held_bf16(m);
    snprintf(buf, cap, "parameters %.0f MiB%s%s%s", (double)ctrl_model_param_bytes(m) / (1 << 20),
             m->base_panels ? ": the projections as bf16 GEMM panels, their fp32 copies given back" : "",
             m->head_held_only ? "; the LM head as its panels alone" : "",
             table == 2   ? "; the embedding held in bf16 as the tied head's panels alone"
             : table == 1 ? "; the embedding held as bf16 values"
                          : "");
}

int ctrl_model_view_held(const ctrl_model *m, const ctrl_param_view *v) {
    if ((long)v->offset == m->off_embed && ctrl_model_embedding_held_bf16(m)) return 1;
    if (m->w16 && in_layers(m->w16_lo, m->cfg.n_layers, v)) return 1;
    /* a weight with held panels (a projection, an LM head -- a tied one beside the fp32 table) */
    return model_pack_held_in(m, v->offset, v->offset + (size_t)v->numel);
}

int ctrl_model_base_held_bf16(const ctrl_model *m) {
    return (m->w16 != NULL && m->w16_keep != NULL) || m->base_panels;
}

int ctrl_model_base_in_panels(const ctrl_model *m) { return m->base_panels; }

size_t ctrl_model_param_bytes(const ctrl_model *m) {
    size_t bytes = sizeof(float) * m->n_params;
    const size_t table = (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size;
    if (m->emb16) /* the frozen embedding in 2 bytes a value, its fp32 pages given back */
        bytes -= (sizeof(float) - sizeof(uint16_t)) * table;
    if (m->emb_panels) /* or as the head's panels (counted with the held ones) */
        bytes -= sizeof(float) * table;
    if (m->head_held_only) /* an untied head as its panels alone */
        bytes -= sizeof(float) * table;
    if (m->base_panels || m->emb_panels) bytes += model_pack_held_bytes(m);
    if (m->base_panels) /* the projections as panels; the norms and biases in place */
        return bytes - sizeof(float) * (size_t)m->w16_n;
    if (!m->w16) return bytes;
    const long *lo = m->w16_lo, *hi = m->w16_lo + m->cfg.n_layers;
    bytes -= sizeof(float) * (size_t)m->w16_n - sizeof(uint16_t) * (size_t)m->w16_n; /* held in 2 bytes */
    if (m->w16_layer >= 0) bytes += sizeof(float) * (size_t)(hi[m->w16_layer] - lo[m->w16_layer]);
    if (m->w16_keep) /* the layers' norms and biases: fp32 beside */
        for (int v = 0; v < m->n_views; v++)
            if (in_layers(lo, m->cfg.n_layers, &m->views[v]) && kept_fp32(&m->views[v]))
                bytes += sizeof(float) * (size_t)m->views[v].numel;
    return bytes;
}

ctrl_status model_bf16_layer_weights(ctrl_model *m, int l) {
    if (m->w16_layer == l) return CTRL_OK;
    const long *lo = m->w16_lo, *hi = m->w16_lo + m->cfg.n_layers;
    /* the previous layer's pages back to the pool (else to the system), lent to layer l's range */
    if (m->w16_layer >= 0 && !page_pool_give_back(m->w16_pool, m->w16_layer))
        model_release_range(m, lo[m->w16_layer], hi[m->w16_layer]);
    const page_piece pc = page_span(m->params + lo[l], m->params + hi[l]);
    page_pool_lend(m->w16_pool, l, &pc, 1);
    ctrl_cpu_bf16_to_f32(m->params + lo[l], m->w16 + w16_at(m, l), hi[l] - lo[l]);
    if (m->w16_keep) keep_layer(m, l, 0); /* under LoRA: the layer's norms and biases, exact */
    m->w16_layer = l;
    return CTRL_OK;
}

int model_bf16_holds(const ctrl_model *m, const float *w) {
    if (!m->w16) return 0;
    if (!m->w16_keep) return 1; /* a frozen model: every parameter holds bf16 values */
    const long off = (long)(w - m->dparams);
    return off >= m->w16_lo[0] && off < m->w16_lo[2 * m->cfg.n_layers - 1];
}

void model_bf16_free(ctrl_model *m) {
    model_pack_free(m, 1);                        /* decoding's panels and a held base's */
    ctrl_cpu_gemm_bf16_packed_free(m->head_keep); /* the trained head's panels (model.c's forward) */
    m->head_keep = NULL;
    m->base_panels = 0;
    page_pool_free(m->w16_pool); /* (what it lent stays in the parameters, as ordinary memory) */
    m->w16_pool = NULL;
    free(m->w16), free(m->w16_lo), free(m->w16_keep), free(m->w16_loaded), free(m->emb16);
    m->emb16 = NULL, m->emb_panels = NULL; /* (the panels: a held entry, freed above) */
    m->w16_loaded = NULL;
    m->w16 = NULL, m->w16_lo = NULL, m->w16_keep = NULL;
}
