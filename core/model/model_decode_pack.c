/* The model's weights as bf16 GEMM panels (see model_internal.h, dec_pack): one table of packed
 * projection weights, found by their offset in the parameters and their shape (kept sorted by
 * offset; a model has a few hundred projections), used three ways.
 *   Decoding: while a bf16 model decodes on a CPU with AVX-512 BF16 (or AMX), each projection's
 *   weight is rounded into the bf16 GEMM's panels the first time decoding multiplies by it
 *   (ctrl_cpu_gemm_bf16_pack, the layout of the kernel running now), and those panels serve every
 *   later step, until the weights change (ctrl_model_weights_changed bumps dec_pack_gen; a stale
 *   weight is packed again, in place, the next time it is used). Without this the GEMM reads the
 *   fp32 weight and packs it anew in every projection of every step.
 *   Training on the same weights: the training forward (x W^T, activation checkpointing's
 *   recompute too) and the backward's dX = dY W multiply by panels decoding packed under the
 *   current generation -- an online trainer's step decodes, then trains on the weights it decoded
 *   with until its optimizer step bumps the generation -- instead of packing W in every call. dX
 *   reads the forward's panels transposed (ctrl_cpu_gemm_bf16_packed_t: no second copy); the one-pass
 *   LM head's logits multiply by the head's panels (model_head_args: ctrl_head_args.w_packed). Panels of
 *   an older generation are never used (model_pack_valid); CTRL_NO_PACKED_TRAIN=1 turns this reuse
 *   off (for comparisons; the numbers are the same bit for bit).
 *   Held: a LoRA run's frozen base (model_bf16_store.c) is packed once as it loads and its fp32
 *   values given back: the panels are then the weights' only copy (held = 1), used by the forward,
 *   dX and decoding alike, never repacked, and kept when decoding's panels are freed.
 * The products are those of ctrl_cpu_gemm_bf16 (the same rounding, the same sums).
 *   AVX2 only (no bf16 instructions: ctrl_cpu_bf16_kind_now() is the fp32 path): decoding packs each
 *   projection into gemm_bf16_avx2.c's panels instead (2 bytes a weight; the same bf16 rounding of
 *   both operands, one fp32 sum over k in order) for calls of up to AVX2_MAX_ROWS (256) rows, a
 *   prefill's included (CTRL_NO_AVX2_PREFILL=1: up to 64, as before 2026-11-28); longer calls take
 *   the fp32 fallback, which rounds W in each call. Without this a decoding
 *   call of fewer than 64 rows multiplied by a rounded fp32 copy of every weight (4 bytes a weight
 *   read, +4 bytes a parameter held) and one of 64 or more rounded every weight again in every call.
 *   Training never reads these panels (its products stay the fallback's, bit for bit). */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cpu/gemm_bf16_avx2.h"
#include "ctrl/log.h"
#include "model/model_internal.h"

typedef struct pack_entry {
    size_t off;
    int in, out;
    unsigned gen;                  /* dec_pack_gen when packed */
    int held;                      /* the weight's only copy (a LoRA run's frozen base) */
    ctrl_cpu_bf16_packed *panels;  /* NULL: not packed yet */
    ctrl_cpu_bf16_avx2_panels *a2; /* AVX2 decoding's panels (NULL: none yet), packed under a2gen */
    unsigned a2gen;
} pack_entry;

/* AVX2 decoding's panels serve calls of at most this many rows: 64 concurrent sequences' steps and
 * a prefill of up to 256 tokens a call, where they are faster than the fallback (gemm_bf16_avx2.c;
 * OpenBLAS's SGEMM is as fast past that); CTRL_NO_AVX2_PREFILL=1: 64, as before 2026-11-28 */
#define AVX2_MAX_ROWS 256
#define AVX2_MAX_ROWS_OLD 64

struct model_pack {
    pack_entry *e;
    int n, cap;
    size_t bytes, held_bytes; /* decoding's panels; the held ones */
    size_t reused;            /* training products on decoding's panels so far */
};

static int switched_off(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static int packable(const ctrl_model *m) {
    const int off = switched_off("CTRL_NO_PACKED_DECODE"); /* 1: packed in every call, for comparisons */
    /* not for weights whose fp32 values change under the same offset without
     * ctrl_model_weights_changed: QLoRA's shared slot, the bf16-held layers, ZeRO-3's gathered slices */
    return !off && m->linear_bf16 && m->be->host_memory && !m->nf4_w && !m->w16 && m->n_round_skip == 0;
}

int model_pack_avx2(const ctrl_model *m) {
    return packable(m) && ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32 && ctrl_cpu_bf16_avx2_available();
}

int model_pack_usable(const ctrl_model *m) {
    if (!packable(m)) return 0;
    if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) return ctrl_cpu_bf16_avx2_available();
    return ctrl_cpu_gemm_bf16_compiled();
}

static int cmp(const pack_entry *e, size_t off, int in, int out) {
    if (e->off != off) return e->off < off ? -1 : 1;
    if (e->in != in) return e->in < in ? -1 : 1;
    return e->out == out ? 0 : e->out < out ? -1 : 1;
}

/* The index of (off, in, out) in the table, or -1 and where it would go (*at). */
static int search(const struct model_pack *p, size_t off, int in, int out, int *at) {
    int lo = 0, hi = p->n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2, c = cmp(&p->e[mid], off, in, out);
        if (c == 0) return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return -1;
}

/* The entry of (off, in, out), inserted (not packed) when new; NULL when out of memory. */
static pack_entry *find(struct model_pack *p, size_t off, int in, int out) {
    int lo = 0;
    const int i = search(p, off, in, out, &lo);
    if (i >= 0) return &p->e[i];
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

static ctrl_status table(ctrl_model *m) {
    if (!m->dec_pack && !(m->dec_pack = calloc(1, sizeof *m->dec_pack)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: the packed weights' table");
    return CTRL_OK;
}

ctrl_status model_pack_begin(ctrl_model *m) {
    MODEL_TRY(table(m));
    m->dec_pack_on = 1;
    return CTRL_OK;
}

ctrl_status model_pack_hold(ctrl_model *m, size_t off, int in, int out) {
    MODEL_TRY(table(m));
    pack_entry *e = find(m->dec_pack, off, in, out);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "model: the packed weights' table");
    if (e->held) return CTRL_OK;
    ctrl_cpu_bf16_packed *panels = ctrl_cpu_gemm_bf16_pack(1, out, in, m->params + off, in);
    if (!panels) return ctrl_error_set(CTRL_ERR_NOMEM, "model: the bf16 panels of a %d x %d weight", out, in);
    if (e->panels) m->dec_pack->bytes -= ctrl_cpu_gemm_bf16_packed_bytes(e->panels);
    ctrl_cpu_gemm_bf16_packed_free(e->panels);
    e->panels = panels, e->held = 1;
    m->dec_pack->held_bytes += ctrl_cpu_gemm_bf16_packed_bytes(panels);
    return CTRL_OK;
}

/* w's entry (NULL: none, or w is not a parameter). */
static pack_entry *entry_of(const ctrl_model *m, const float *w, int IN, int OUT) {
    struct model_pack *p = m->dec_pack;
    int at = 0;
    if (!p || w < m->dparams || w >= m->dparams + m->n_params) return NULL;
    const int i = search(p, (size_t)(w - m->dparams), IN, OUT, &at);
    return i >= 0 ? &p->e[i] : NULL;
}

const ctrl_cpu_bf16_packed *model_pack_valid(const ctrl_model *m, const float *w, int IN, int OUT) {
    const pack_entry *e = entry_of(m, w, IN, OUT);
    if (!e || !e->panels) return NULL;
    if (e->held) return e->panels;
    /* decoding's, packed from the weights as they are now (no change since: the same generation) */
    if (e->gen != m->dec_pack_gen || switched_off("CTRL_NO_PACKED_TRAIN") || !model_pack_usable(m) ||
        ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32)
        return NULL;
    m->dec_pack->reused++;
    return e->panels;
}

size_t model_pack_reused(const ctrl_model *m) { return m->dec_pack ? m->dec_pack->reused : 0; }

/* A held weight where no bf16 kernel can read its panels (CTRL_NO_AVX512BF16 set after holding):
 * its values unpacked into fp32 scratch (exactly: they are bf16 values) for the backend's product. */
static float *held_values(const pack_entry *e) {
    float *w = malloc(sizeof(float) * (size_t)e->in * (size_t)e->out);
    if (w && ctrl_cpu_gemm_bf16_packed_unpack(e->panels, w, e->in) != 0) free(w), w = NULL;
    return w;
}

static void add_bias(float *out, const float *bias, int T, int OUT) {
    if (!bias) return;
#pragma omp parallel for schedule(static) if ((size_t)T * OUT > 65536)
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
}

/* Decoding's product on AVX2 panels (packed where new or stale), a prefill's of up to AVX2_MAX_ROWS
 * rows too; more rows, or no memory for the panels: nothing done (*used 0), the fallback runs. */
static ctrl_status avx2_linear(struct model_pack *p, pack_entry *e, unsigned gen, float *out, const float *x,
                               const float *w, const float *bias, int T, int IN, int OUT, int *used) {
    const int max_rows = switched_off("CTRL_NO_AVX2_PREFILL") ? AVX2_MAX_ROWS_OLD : AVX2_MAX_ROWS;
    if (T > max_rows) return CTRL_OK;
    static int said; /* once per process: the backend's note says the other bf16 products are fp32's speed */
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        CTRL_INFO("cpu: bf16 decoding on AVX2 panels (weights packed once, 2 bytes each; calls of up to %d "
                  "rows); training and longer forwards take the fp32 SGEMM fallback",
                  max_rows);
    if (!e->a2) {
        if (!(e->a2 = ctrl_cpu_bf16_avx2_pack(OUT, IN, w, IN))) return CTRL_OK;
        p->bytes += ctrl_cpu_bf16_avx2_bytes(e->a2);
        e->a2gen = gen;
    } else if (e->a2gen != gen) {
        if (ctrl_cpu_bf16_avx2_repack(e->a2, w, IN) != 0) return CTRL_OK;
        e->a2gen = gen;
    }
    if (ctrl_cpu_bf16_avx2_linear(T, x, IN, e->a2, out, OUT) != 0) return CTRL_OK;
    add_bias(out, bias, T, OUT);
    *used = 1;
    return CTRL_OK;
}

ctrl_status model_pack_linear(const ctrl_model *m, float *out, const float *x, const float *w,
                              const float *bias, int T, int IN, int OUT, int *used) {
    *used = 0;
    struct model_pack *p = m->dec_pack;
    if (!p || w < m->dparams || w >= m->dparams + m->n_params)
        return CTRL_OK; /* not a parameter (adapters' banks) */
    pack_entry *e = m->dec_pack_on ? find(p, (size_t)(w - m->dparams), IN, OUT) : entry_of(m, w, IN, OUT);
    if (m->dec_pack_on && !e) return ctrl_error_set(CTRL_ERR_NOMEM, "decode: the packed weights' table");
    if (!e) return CTRL_OK;
    if (e->held) { /* the only copy: its panels, or its values unpacked where no bf16 kernel runs */
        *used = 1;
        if (ctrl_cpu_gemm_bf16_packed(0, T, x, IN, e->panels, out, OUT, 0) == 0)
            return add_bias(out, bias, T, OUT), CTRL_OK;
        float *v = held_values(e);
        if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "model: a held %d x %d weight unpacked", OUT, IN);
        ctrl_status st = model_bf16_as_fp32(m) ? m->be->linear_forward(out, x, v, bias, T, IN, OUT)
                                               : m->be->linear_forward_bf16(out, x, v, bias, T, IN, OUT, 1);
        free(v);
        return st;
    }
    if (!m->dec_pack_on) { /* training: decoding's panels where they are current */
        const ctrl_cpu_bf16_packed *panels = model_pack_valid(m, w, IN, OUT);
        if (!panels || ctrl_cpu_gemm_bf16_packed(0, T, x, IN, panels, out, OUT, 0) != 0) return CTRL_OK;
        add_bias(out, bias, T, OUT);
        *used = 1;
        return CTRL_OK;
    }
    if (model_pack_avx2(m)) return avx2_linear(p, e, m->dec_pack_gen, out, x, w, bias, T, IN, OUT, used);
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
    if (ctrl_cpu_gemm_bf16_packed(0, T, x, IN, e->panels, out, OUT, 0) != 0) return CTRL_OK;
    add_bias(out, bias, T, OUT);
    *used = 1;
    return CTRL_OK;
}

ctrl_status model_pack_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias,
                                       const float *dout, const float *x, const float *w, int T, int IN,
                                       int OUT, int *used) {
    *used = 0;
    const pack_entry *e = dx ? entry_of(m, w, IN, OUT) : NULL;
    const ctrl_cpu_bf16_packed *panels = dx ? model_pack_valid(m, w, IN, OUT) : NULL;
    if (!panels) return CTRL_OK;
    if (ctrl_cpu_gemm_bf16_packed_t(0, T, dout, OUT, panels, dx, IN, 0) != 0) {
        if (!e->held) return CTRL_OK; /* the per-call product, on w */
        float *v = held_values(e);
        if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "model: a held %d x %d weight unpacked", OUT, IN);
        ctrl_status st = model_bf16_as_fp32(m)
                             ? m->be->linear_backward(dx, NULL, NULL, dout, x, v, T, IN, OUT)
                             : m->be->linear_backward_bf16(dx, NULL, NULL, dout, x, v, T, IN, OUT, 1);
        free(v);
        if (st != CTRL_OK) return st;
    }
    *used = 1;
    /* dW += dY^T x and db: W is not read */
    if (!dw && !dbias) return CTRL_OK;
    return model_bf16_as_fp32(m) ? m->be->linear_backward(NULL, dw, dbias, dout, x, w, T, IN, OUT)
                                 : m->be->linear_backward_bf16(NULL, dw, dbias, dout, x, w, T, IN, OUT, 0);
}

size_t model_pack_bytes(const ctrl_model *m) { return m->dec_pack ? m->dec_pack->bytes : 0; }

size_t ctrl_model_decode_panel_bytes(const ctrl_model *m) { return model_pack_bytes(m); }

size_t model_pack_held_bytes(const ctrl_model *m) { return m->dec_pack ? m->dec_pack->held_bytes : 0; }

const ctrl_cpu_bf16_packed *model_pack_held(const ctrl_model *m, size_t off, int in, int out) {
    const pack_entry *e = entry_of(m, m->dparams + off, in, out);
    return e && e->held ? e->panels : NULL;
}

int model_pack_held_in(const ctrl_model *m, size_t lo, size_t hi) {
    const struct model_pack *p = m->dec_pack;
    for (int i = 0; p && i < p->n; i++)
        if (p->e[i].held && p->e[i].off >= lo && p->e[i].off + (size_t)p->e[i].in * p->e[i].out <= hi)
            return 1;
    return 0;
}

int model_pack_rewrite(ctrl_model *m, size_t lo, size_t hi, const float *x) {
    struct model_pack *p = m->dec_pack;
    int n = 0;
    for (int i = 0; p && i < p->n; i++) {
        const pack_entry *e = &p->e[i];
        if (!e->held || e->off < lo || e->off + (size_t)e->in * e->out > hi) continue;
        if (ctrl_cpu_gemm_bf16_repack(e->panels, x + (e->off - lo), e->in) != 0) return -1;
        n++;
    }
    return n;
}

void model_pack_free(ctrl_model *m, int held_too) {
    struct model_pack *p = m->dec_pack;
    if (!p) return;
    int kept = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->e[i].held && !held_too) {
            p->e[kept++] = p->e[i];
            continue;
        }
        ctrl_cpu_gemm_bf16_packed_free(p->e[i].panels);
        ctrl_cpu_bf16_avx2_free(p->e[i].a2);
    }
    p->n = kept, p->bytes = 0;
    if (kept) return;
    free(p->e), free(p);
    m->dec_pack = NULL;
}
