/* A frozen model held in bf16 (ctrl_model_hold_bf16; a distillation teacher with [teacher] dtype =
 * bf16): every parameter is rounded to bf16 once, each layer's weights are kept as 2-byte bf16
 * values (w16) and their fp32 pages are given back to the system (madvise MADV_DONTNEED: the pages
 * read as zeros and hold no memory until written again). Before a layer runs (forward or decode,
 * model_layer_forward) its weights are widened back into their fp32 place, and the previously
 * widened layer's pages are given back: one layer in fp32 at a time. The embeddings, the final norm
 * and the LM head stay fp32 (rounded to bf16 values). The layout does not change: the views,
 * offsets and kernels see the same fp32 parameters, which the linear projections take as bf16
 * values (no rounded copy is made). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

/* Gives back the whole pages inside params[lo, hi) (their contents become zeros). */
static void release_range(ctrl_model *m, long lo, long hi) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)(m->params + lo), b = (uintptr_t)(m->params + hi);
    a = (a + page - 1) & ~(page - 1), b &= ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advisory: kept resident if refused */
}

ctrl_status ctrl_model_hold_bf16(ctrl_model *m) {
    if (m->n_train != 0 || m->has_lora || m->nf4_w)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: only a frozen model without adapters is held in bf16");
    if (!m->be->host_memory || m->params != m->dparams)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: bf16 storage is for a model computing on the CPU");
    const int L = m->cfg.n_layers;
    long *lo = malloc(sizeof(long) * (size_t)(2 * L + 1));
    if (!lo) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    long *hi = lo + L;
    for (int l = 0; l < L; l++) lo[l] = -1, hi[l] = -1;
    long total = 0;
    for (int v = 0; v < m->n_views; v++) {
        const ctrl_param_view *pv = &m->views[v];
        int l = -1, n = 0;
        if (sscanf(pv->name, "model.layers.%d.%n", &l, &n) != 1 || n == 0 || l < 0 || l >= L) continue;
        const long off = (long)pv->offset, end = off + (long)pv->numel;
        if (lo[l] < 0 || off < lo[l]) lo[l] = off;
        if (end > hi[l]) hi[l] = end;
        total += pv->numel;
    }
    long sum = 0; /* every layer one contiguous range of its own views (model.c's layout) */
    for (int l = 0; l < L; l++) sum += hi[l] - lo[l];
    if (sum != total || L == 0) {
        free(lo);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: the layers' weights are not contiguous; kept in fp32");
    }
    ctrl_cpu_round_to_bf16(m->params, m->params, (int64_t)m->n_params);
    uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)(total > 0 ? total : 1));
    if (!w16) {
        free(lo);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: the bf16 copy of %ld weights", total);
    }
    long at = 0;
    for (int l = 0; l < L; l++) {
        ctrl_cpu_f32_to_bf16(w16 + at, m->params + lo[l], hi[l] - lo[l]); /* exact: already bf16 values */
        at += hi[l] - lo[l];
        release_range(m, lo[l], hi[l]);
    }
    m->w16 = w16, m->w16_lo = lo, m->w16_layer = -1;
    m->rounded_valid = 0;
    return CTRL_OK;
}

ctrl_status model_bf16_layer_weights(ctrl_model *m, int l) {
    if (m->w16_layer == l) return CTRL_OK;
    const long *lo = m->w16_lo, *hi = m->w16_lo + m->cfg.n_layers;
    if (m->w16_layer >= 0) release_range(m, lo[m->w16_layer], hi[m->w16_layer]);
    long at = 0;
    for (int k = 0; k < l; k++) at += hi[k] - lo[k];
    ctrl_cpu_bf16_to_f32(m->params + lo[l], m->w16 + at, hi[l] - lo[l]);
    m->w16_layer = l;
    return CTRL_OK;
}

void model_bf16_free(ctrl_model *m) {
    free(m->w16), free(m->w16_lo);
    m->w16 = NULL, m->w16_lo = NULL;
}
