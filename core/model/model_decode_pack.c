/* Decoding's weights packed to bf16 once (see model_internal.h, dec_pack): while a bf16 model decodes
 * on a CPU with AVX-512 BF16, each projection's weight is rounded into the bf16 GEMM's panels the
 * first time decoding multiplies by it (ctrl_cpu_gemm_bf16_pack, the layout of the kernel running
 * now: AMX or AVX-512 BF16), and those panels serve every later step, until the weights change
 * (ctrl_model_weights_changed bumps dec_pack_gen; a stale weight is packed again, in place, the next
 * time it is used). Without this the GEMM reads the fp32 weight and packs it anew in every
 * projection of every step: 4 bytes a parameter read and 2 written per step, where the packed panels
 * are 2 bytes read. The products are those of ctrl_cpu_gemm_bf16 (the same rounding, the same sums).
 * The weights are found by their offset in the parameters and their shape; the table is kept
 * sorted by offset (a model has a few hundred projections). */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

typedef struct pack_entry {
    size_t off;
    int in, out;
    unsigned gen;                 /* dec_pack_gen when packed */
    ctrl_cpu_bf16_packed *panels; /* NULL: not packed yet */
} pack_entry;

struct model_pack {
    pack_entry *e;
    int n, cap;
    size_t bytes;
};

int model_pack_usable(const ctrl_model *m) {
    const char *no = getenv("CTRL_NO_PACKED_DECODE"); /* 1: packed in every call, for comparisons */
    const int off = no && *no && strcmp(no, "0") != 0;
    /* not for weights whose fp32 values change under the same offset without
     * ctrl_model_weights_changed: QLoRA's shared slot, the bf16-held layers, ZeRO-3's gathered slices */
    return !off && m->linear_bf16 && m->be->host_memory && !m->nf4_w && !m->w16 && m->n_round_skip == 0 &&
           ctrl_cpu_gemm_bf16_compiled() && ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32;
}

static int cmp(const pack_entry *e, size_t off, int in, int out) {
    if (e->off != off) return e->off < off ? -1 : 1;
    if (e->in != in) return e->in < in ? -1 : 1;
    return e->out == out ? 0 : e->out < out ? -1 : 1;
}

/* The entry of (off, in, out), inserted (not packed) when new; NULL when out of memory. */
static pack_entry *find(struct model_pack *p, size_t off, int in, int out) {
    int lo = 0, hi = p->n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2, c = cmp(&p->e[mid], off, in, out);
        if (c == 0) return &p->e[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (p->n == p->cap) {
        const int cap = p->cap ? 2 * p->cap : 256;
        pack_entry *e = realloc(p->e, sizeof *e * (size_t)cap);
        if (!e) return NULL;
        p->e = e, p->cap = cap;
    }
    memmove(p->e + lo + 1, p->e + lo, sizeof *p->e * (size_t)(p->n - lo));
    p->e[lo] = (pack_entry){.off = off, .in = in, .out = out};
    p->n++;
    return &p->e[lo];
}

ctrl_status model_pack_begin(ctrl_model *m) {
    if (!m->dec_pack && !(m->dec_pack = calloc(1, sizeof *m->dec_pack)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: the packed weights' table");
    m->dec_pack_on = 1;
    return CTRL_OK;
}

ctrl_status model_pack_linear(const ctrl_model *m, float *out, const float *x, const float *w,
                              const float *bias, int T, int IN, int OUT, int *used) {
    *used = 0;
    struct model_pack *p = m->dec_pack;
    if (!p || w < m->dparams || w >= m->dparams + m->n_params)
        return CTRL_OK; /* not a parameter (adapters' banks) */
    pack_entry *e = find(p, (size_t)(w - m->dparams), IN, OUT);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "decode: the packed weights' table");
    if (!e->panels) {
        e->panels = ctrl_cpu_gemm_bf16_pack(1, OUT, IN, w, IN);
        if (!e->panels) return CTRL_OK; /* no fast path now, or no memory: the per-call product */
        p->bytes += ctrl_cpu_gemm_bf16_packed_bytes(e->panels);
        e->gen = m->dec_pack_gen;
    } else if (e->gen != m->dec_pack_gen) { /* the weights changed (or the kernel did): again, in place */
        const size_t before = ctrl_cpu_gemm_bf16_packed_bytes(e->panels);
        if (ctrl_cpu_gemm_bf16_repack(e->panels, w, IN) != 0) return CTRL_OK;
        p->bytes += ctrl_cpu_gemm_bf16_packed_bytes(e->panels) - before;
        e->gen = m->dec_pack_gen;
    }
    if (ctrl_cpu_gemm_bf16_packed(0, T, x, IN, e->panels, out, OUT, 0) != 0) {
        e->gen = m->dec_pack_gen - 1; /* the kernel's layout changed since packing (CTRL_NO_AMX): next time */
        return CTRL_OK;
    }
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)T * OUT > 65536)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
    }
    *used = 1;
    return CTRL_OK;
}

size_t model_pack_bytes(const ctrl_model *m) { return m->dec_pack ? m->dec_pack->bytes : 0; }

void model_pack_free(ctrl_model *m) {
    if (!m->dec_pack) return;
    for (int i = 0; i < m->dec_pack->n; i++) ctrl_cpu_gemm_bf16_packed_free(m->dec_pack->e[i].panels);
    free(m->dec_pack->e), free(m->dec_pack);
    m->dec_pack = NULL;
}
