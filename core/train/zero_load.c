/* ZeRO-3 loading each rank's slices only (zero.h's train_zero_load): as DeepSpeed's zero.Init, no
 * rank ever holds the whole model. The model is laid out with its parameters zero and untouched
 * (calloc: their pages are not resident), the units and slices train_zero_init would cut are laid
 * over it, and only this rank's slice of each layer, of the embeddings and of an untied head, and
 * the rest (the final norm: kept whole on every rank), are read from the safetensors
 * files (checked finite there only; core/model/model_io.c's ctrl_model_load_part). The pages of the
 * mapped files are let go as they are read. So a rank's peak at start-up is its slices plus what
 * lies outside the layers, not the whole model; every rank reads the same files, so no broadcast
 * from rank 0 is needed either (the weights' checksum at each save still compares the ranks). */
#include <stdlib.h>

#include <ctrl/log.h>

#include "train/zero.h"

/* The ranges of parameters this rank keeps after train_zero_attach: its slice of each layer's
 * unit and of the embeddings' and head's, every other unit whole, and anything outside the trainable floats
 * whole. */
static ctrl_status rank_parts(const ctrl_model *m, void *ctx, size_t **ranges, int *n) {
    (void)ctx;
    train_zero z;
    ctrl_status st = train_zero_init(&z, 3, (ctrl_model *)m, 1, 0, 0, 0);
    size_t all = 0;
    ctrl_model_params((ctrl_model *)m, &all);
    size_t *r = st == CTRL_OK ? malloc(sizeof *r * 2 * ((size_t)z.n_units + 2)) : NULL;
    if (st == CTRL_OK && !r) st = ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    int k = 0;
#define ADD(lo, hi)                                                                                          \
    do {                                                                                                     \
        if ((hi) <= (lo)) break;                                                                             \
        if (k > 0 && r[2 * k - 1] == (lo))                                                                   \
            r[2 * k - 1] = (hi); /* adjacent: one range */                                                   \
        else                                                                                                 \
            r[2 * k] = (lo), r[2 * k + 1] = (hi), k++;                                                       \
    } while (0)
    if (st == CTRL_OK) {
        ADD((size_t)0, z.first);
        for (int u = 0; u < z.n_units; u++) {
            size_t lo = z.units[u].a, hi = z.units[u].b;
            if (z.units[u].layer != -1)                    /* the layers, the embeddings, an untied head */
                train_zero_slice(&z, u, z.rank, &lo, &hi); /* layers, embeddings, head */
            ADD(z.first + lo, z.first + hi);
        }
        ADD(z.first + z.total, all);
    }
#undef ADD
    train_zero_free(&z);
    if (st != CTRL_OK) {
        free(r);
        return st;
    }
    *ranges = r, *n = k;
    return CTRL_OK;
}

ctrl_status train_zero_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out) {
    ctrl_status st = ctrl_model_load_part(dir, attn, rank_parts, NULL, out);
    if (st == CTRL_OK)
        CTRL_INFO("zero3: each rank read its slices of the layers' parameters from %s (and of the embeddings "
                  "and the head; the final norm whole), not the whole model",
                  dir);
    return st;
}
