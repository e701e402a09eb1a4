/* ZeRO-3 loading each rank's slices only (zero.h's train_zero_load): as DeepSpeed's zero.Init, no
 * rank ever holds the whole model. The model is laid out with its parameters zero and untouched
 * (calloc: their pages are not resident), the units and slices train_zero_init would cut are laid
 * over it, and only this rank's slice of each layer, of the embeddings and of an untied head, and
 * the rest (the final norm: kept whole on every rank), are read from the safetensors
 * files (checked finite there only; core/model/model_io.c's ctrl_model_load_part). The pages of the
 * mapped files are let go as they are read. So a rank's peak at start-up is its slices plus what
 * lies outside the layers, not the whole model; every rank reads the same files, so no broadcast
 * from rank 0 is needed either (the weights' checksum at each save still compares the ranks).
 * A LoRA run (train_lora.c, ctrl_model_load_lora_part) reads the frozen base the same way: its slice
 * of each layer's base, of the frozen embeddings and of an untied head, as zero.c's frozen ranges cut
 * them; QLoRA keeps its super-blocks of each NF4 weight (train_zero_rank_nf4_parts). */
#include <stdint.h>
#include <stdlib.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "model/nf4.h"
#include "train/zero.h"

static int cmp_unit(const void *a, const void *b) {
    const size_t x = ((const train_zero_unit *)a)->a, y = ((const train_zero_unit *)b)->a;
    return x < y ? -1 : x > y;
}

/* The ranges this rank keeps (parts_of, below) of a model laid out as train_zero_init cuts it. */
static ctrl_status parts_of(const train_zero *z, size_t all, size_t **ranges, int *n);
static ctrl_status rank_parts(const ctrl_model *m, void *ctx, size_t **ranges, int *n) {
    train_zero z;
    (void)ctx;
    ctrl_status st = train_zero_init(&z, 3, (ctrl_model *)m, 1, 0, 0, 0);
    size_t all = 0;
    ctrl_model_params((ctrl_model *)m, &all);
    if (st == CTRL_OK) st = parts_of(&z, all, ranges, n);
    train_zero_free(&z);
    return st;
}

/* The ranges of parameters this rank keeps after train_zero_attach: its slice of each layer's
 * unit and of the embeddings' and head's, every other unit whole, and anything outside the trainable floats
 * whole -- but for LoRA's frozen base (below z.first): this rank's slice of each frozen range zero.c
 * cuts (each layer's base, the frozen embeddings, an untied head; QLoRA's layers keep their few fp32
 * floats whole, the NF4 weights being cut by their own spans, below), the rest of it (the final norm)
 * whole. The adapters lie in the ranges too; the loader makes them, never reads them. */
static ctrl_status parts_of(const train_zero *z, size_t all, size_t **ranges, int *n) {
    train_zero_unit *fz = malloc(sizeof *fz * ((size_t)z->n_slots + 1));
    int nf = 0;
    for (int l = 0; fz && z->frozen && l < z->n_slots; l++)
        if (z->frozen[l].layer >= 0 && z->frozen[l].b > z->frozen[l].a) fz[nf++] = z->frozen[l];
    if (fz) qsort(fz, (size_t)nf, sizeof *fz, cmp_unit); /* ascending (the embeddings first) */
    size_t *r = fz ? malloc(sizeof *r * 2 * ((size_t)z->n_units + 2 * (size_t)nf + 3)) : NULL;
    if (!r) {
        free(fz);
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    }
    int k = 0;
#define ADD(lo, hi)                                                                                          \
    do {                                                                                                     \
        if ((hi) <= (lo)) break;                                                                             \
        if (k > 0 && r[2 * k - 1] == (lo))                                                                   \
            r[2 * k - 1] = (hi); /* adjacent: one range */                                                   \
        else                                                                                                 \
            r[2 * k] = (lo), r[2 * k + 1] = (hi), k++;                                                       \
    } while (0)
    size_t at = 0; /* the frozen base: whole between its sliced ranges */
    for (int i = 0; i < nf; i++) {
        size_t lo, hi;
        train_zero_cut(z, fz[i], z->rank, &lo, &hi);
        ADD(at, fz[i].a);
        ADD(lo, hi);
        at = fz[i].b;
    }
    ADD(at, z->first);
    for (int u = 0; u < z->n_units; u++) {
        size_t lo = z->units[u].a, hi = z->units[u].b;
        if (z->units[u].layer != -1)                   /* the layers, the embeddings, an untied head */
            train_zero_slice(z, u, z->rank, &lo, &hi); /* layers, embeddings, head */
        ADD(z->first + lo, z->first + hi);
    }
    ADD(z->first + z->total, all);
#undef ADD
    free(fz);
    *ranges = r, *n = k;
    return CTRL_OK;
}

ctrl_status train_zero_load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                       uint64_t seed, ctrl_model **out) {
    return ctrl_model_load_classifier_part(dir, attn, num_labels, seed, rank_parts, NULL, out);
}

ctrl_status train_zero_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out) {
    ctrl_status st = ctrl_model_load_part(dir, attn, rank_parts, NULL, out);
    if (st == CTRL_OK)
        CTRL_INFO("zero3: each rank read its slices of the layers' parameters from %s (and of the embeddings "
                  "and the head; the final norm whole), not the whole model",
                  dir);
    return st;
}

ctrl_status train_zero_rank_parts(const ctrl_model *m, void *ctx, size_t **ranges, int *n) {
    return rank_parts(m, ctx, ranges, n);
}

/* QLoRA: this rank's values of each NF4 weight, as zero_nf4.c will cut the store. */
ctrl_status train_zero_rank_nf4_parts(const ctrl_model *m, void *ctx, int64_t *spans) {
    (void)ctx;
    return train_zero_nf4_spans(m, ctrl_collective_rank(), ctrl_collective_size(), spans);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

ctrl_status train_zero_digest(train_zero *z, ctrl_model *m) {
    ctrl_status st = train_zero_gather_all(z); /* every rank's slices put together: the whole model */
    z->whole_gathers--;                        /* (a test's check, not the run's: train_zero_whole_report) */
    if (st != CTRL_OK) return st;
    size_t n = 0;
    const float *p = ctrl_model_params(m, &n);
    uint64_t h = fnv(14695981039346656037ull, p, n * sizeof *p);
    int per = 0;
    const struct ctrl_nf4 *store = ctrl_model_nf4_store(m, &per); /* QLoRA: its weights, whole now */
    for (int i = 0; store && i < ctrl_model_cfg(m)->n_layers * per; i++) {
        const struct ctrl_nf4 *q = &store[i];
        if (!q->packed) continue;
        size_t c[3];
        ctrl_nf4_part_counts(0, q->n, c);
        h = fnv(fnv(fnv(fnv(h, q->packed, c[0]), q->qabsmax, c[1]), q->absmax2, c[2]), &q->offset,
                sizeof q->offset);
    }
    train_zero_release_all(z);
    /* the two 32-bit halves exactly as doubles: max and -min equal iff every rank's digest agrees */
    double v[4] = {(double)(h >> 32), (double)(h & 0xffffffffu), -(double)(h >> 32),
                   -(double)(h & 0xffffffffu)};
    st = ctrl_collective_allreduce_max_f64(v, 4);
    if (st == CTRL_OK && ctrl_collective_rank() == 0)
        CTRL_INFO("zero3: the model gathered whole after attach: digest %08llx%08llx (%s)",
                  (unsigned long long)v[0], (unsigned long long)v[1],
                  v[0] == -v[2] && v[1] == -v[3] ? "every rank's the same" : "the ranks DIFFER");
    return st;
}
