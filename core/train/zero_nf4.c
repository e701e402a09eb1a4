/* ZeRO-3 over a QLoRA base ([memory] strategies = zero3 with [peft] quantization = nf4;
 * see zero.h): DeepSpeed ZeRO-3 + QLoRA (bnb_4bit_quant_storage) partitions the quantized base across
 * the ranks like any other parameter. Here each rank keeps its slice of every layer's NF4 weights --
 * cut on super-blocks of 16,384 values (as nf4.h's ctrl_nf4_span; span below), so that each of the three
 * parts (the packed codes, the absmax bytes, the absmax scales) is cut into whole elements -- and the model's
 * store holds nothing for them between uses. Just before a layer's forward or backward (the gathers
 * of zero_layers.c: need_layer) every weight of the layer is rebuilt whole: each part's buffer
 * allocated, this rank's piece copied to its place and the three parts all-gathered in place (the
 * pieces are whole floats -- 8,192, 256 and 4 bytes a super-block -- but the last), the collectives
 * of the layer started together and then waited for; after the use (release_slot) the buffers are
 * freed. The whole model (train_zero_gather_all: a save not streamed, generation gathered whole)
 * gathers every layer's; server mode's streamed push (zero_save.c) one layer's at a time to rank 0
 * alone (train_zero_nf4_gather_root), kept until its writer moves on. The products then read the
 * store as with one process, bit for bit (the adapters' gradients reduced as zero3 reduces any: plain data
 * parallel's within rounding). What the base's fp32 slot and the layers' norms are is unchanged (zero.c
 * leaves a QLoRA layer's frozen fp32 parameters whole: its norms and biases, a few floats).
 *
 * Prefetch (prefetch_bucket_size): start_layer starts a layer's NF4 gathers with its adapters' (the
 * buffers allocated then), need_layer waits for them; the bucket counts the NF4 bytes in flight as
 * floats' worth (train_zero_nf4_floats) beside the adapters' floats.
 *
 * A CUDA model: the products read the device's copy of the store (ctrl_model_nf4_device), so that is
 * the one cut (device_cut: this rank's pieces in device memory, the whole copy freed) and rebuilt
 * (device_start: buffers allocated on the device, the pieces all-gathered over NCCL on the
 * communication stream); the host's store keeps each weight's n and offset, and rank 0's is what a
 * streamed save gathers into (root_whole), as on the CPU. Loading (zero_load.c, train_zero_nf4_spans): each
 * NF4 weight is read and quantized whole as it loads, one at a time (its absmax offset is the mean over all
 * of its blocks), and only this rank's super-blocks kept -- the spans cut_weight then finds in the store,
 * checked to be its own -- so the load's peak holds one weight whole, not the store; where the base is read
 * whole (train_setup.c's lora_reads_sliced) the whole store is quantized on every rank and cut here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "device/backend.h"
#include "model/lora.h"
#include "model/nf4.h"
#include "train/zero.h"

typedef struct nf4_weight {
    int at;       /* its index in the model's store */
    int64_t n;    /* the whole weight's values */
    float offset; /* its absmax offset (every slice's) */
    ctrl_nf4 mine;
    int *counts;       /* [3][size]: each rank's piece of each part, in floats (4-byte elements) */
    size_t floats[3];  /* each part's whole buffer in floats (the pieces end to end) */
    size_t pos[3];     /* where this rank's piece starts in each part, in floats */
    size_t mine_b[3];  /* this rank's pieces' bytes */
    size_t whole_b[3]; /* the whole parts' bytes */
} nf4_weight;

struct zero_nf4 {
    ctrl_model *model;
    ctrl_nf4 *store;
    int rank, size, n_layers;
    nf4_weight *w;
    int n_w;
    int *layer_at; /* layer l's weights: w[layer_at[l] .. layer_at[l + 1]) */
    int per;       /* the store's weights a layer */
    /* layer l: 0 sliced (the store holds nothing), 1 its gathers in flight (prefetched: n_pend[l]
     * handles at pend[l * 3 * per]), 2 whole in the store */
    char *state;
    void **pend;
    int *n_pend;
    size_t mine_bytes, whole_bytes;
    int64_t deal; /* the super-blocks dealt beyond an even share so far (span's rot) */
    long gathers; /* layers gathered since init */
    /* a CUDA model: the store the products read is the device's (dstore, 3 buffers a weight by store
     * index; the host's keeps each weight's n and offset, and rank 0's is filled by a streamed save's
     * gathers); this rank's pieces in device memory (dmine, 3 a weight by w index); NULL on the CPU */
    const ctrl_backend_ops *dev;
    void **dstore, **dmine;
    char *root_whole; /* a device model: layer l whole in rank 0's host store (gather_root) */
};

static size_t in_floats(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

/* Rank r's values [*v0, *v1) of a weight of n values: its super-blocks dealt as ctrl_nf4_span deals
 * them (consecutive, in rank order, each rank n / size of them), the remainder's one more each going
 * to the ranks from `rot` on, cyclically -- rot follows the extra super-blocks dealt so far over the
 * model (struct zero_nf4's deal), so the ranks' totals stay within a super-block or two of an even
 * share (a weight's last super-block may be partial) where every weight's first ranks taking the extra
 * ones would add up. */
static void span(int64_t n, int r, int size, int64_t rot, int64_t *v0, int64_t *v1) {
    const int64_t supers = (n + CTRL_NF4_SUPER - 1) / CTRL_NF4_SUPER, each = supers / size,
                  more = supers % size;
    int64_t s0 = 0;
    for (int k = 0; k < r; k++) s0 += each + ((k - rot % size + size) % size < more);
    const int64_t s1 = s0 + each + ((r - rot % size + size) % size < more);
    *v0 = s0 * CTRL_NF4_SUPER < n ? s0 * CTRL_NF4_SUPER : n;
    *v1 = s1 * CTRL_NF4_SUPER < n ? s1 * CTRL_NF4_SUPER : n;
}

ctrl_status train_zero_nf4_spans(const ctrl_model *m, int rank, int size, int64_t *spans) {
    const int nl = ctrl_model_cfg(m)->n_layers, per = LORA_N_TARGETS;
    int64_t *n = calloc((size_t)(nl > 0 ? nl : 1) * (size_t)per, sizeof *n);
    if (!n) return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: the NF4 spans");
    for (int i = 0; i < ctrl_model_view_count((ctrl_model *)m);
         i++) { /* the store's weights: the NF4 views */
        const ctrl_param_view *v = ctrl_model_view((ctrl_model *)m, i);
        if (v->nf4 > 0 && v->nf4 <= nl * per) n[v->nf4 - 1] = v->numel;
    }
    int64_t deal =
        0; /* as train_zero_nf4_init deals them: the weights in store order, struct zero_nf4's deal */
    for (int i = 0; i < nl * per; i++) {
        if (!n[i]) continue;
        span(n[i], rank, size, deal, &spans[2 * i], &spans[2 * i + 1]);
        deal += (n[i] + CTRL_NF4_SUPER - 1) / CTRL_NF4_SUPER % size;
    }
    free(n);
    return CTRL_OK;
}

/* A weight's parts: each rank's pieces (in floats; whole floats but the last non-empty one's), and
 * this rank's slice of the whole q, copied out (or, loaded in pieces, q's piece: checked to be that
 * slice, `part` its values). */
static ctrl_status cut_weight(struct zero_nf4 *s, nf4_weight *w, const ctrl_nf4 *q, const int64_t *part) {
    w->n = q->n, w->offset = q->offset;
    if (!(w->counts = calloc((size_t)(3 * s->size), sizeof(int))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: the NF4 slices' counts");
    ctrl_nf4_part_counts(0, q->n, w->whole_b);
    for (int r = 0; r < s->size; r++) {
        int64_t v0, v1;
        size_t c[3];
        span(q->n, r, s->size, s->deal, &v0, &v1);
        ctrl_nf4_part_counts(v0, v1, c);
        for (int k = 0; k < 3; k++) {
            /* a piece after one that is not whole floats would land off its place (an empty piece,
             * after the weight's end, lands nowhere) */
            if (v1 > v0 &&
                w->floats[k] * sizeof(float) != (k == 0   ? (size_t)(v0 / 2)
                                                 : k == 1 ? (size_t)(v0 / CTRL_NF4_BLOCK)
                                                          : sizeof(float) * (size_t)(v0 / CTRL_NF4_SUPER)))
                return ctrl_error_set(CTRL_ERR_RUNTIME, "zero3: an NF4 slice of %lld values is not aligned",
                                      (long long)q->n);
            if (r == s->rank) w->pos[k] = w->floats[k], w->mine_b[k] = c[k];
            const size_t f = v1 > v0 ? in_floats(c[k]) : 0;
            if (f > (size_t)INT32_MAX)
                return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "zero3: an NF4 weight of %lld values",
                                      (long long)q->n);
            w->counts[k * s->size + r] = (int)f, w->floats[k] += f;
        }
    }
    int64_t v0, v1;
    span(q->n, s->rank, s->size, s->deal, &v0, &v1);
    s->deal += (q->n + CTRL_NF4_SUPER - 1) / CTRL_NF4_SUPER % s->size;
    if (part && (part[0] != v0 || part[1] != v1)) /* the loader's piece must be this slice exactly */
        return ctrl_error_set(
            CTRL_ERR_RUNTIME,
            "zero3: an NF4 weight of %lld values was loaded as values [%lld, %lld), its slice "
            "here is [%lld, %lld)",
            (long long)q->n, (long long)part[0], (long long)part[1], (long long)v0, (long long)v1);
    const int64_t at = part ? 0 : v0; /* where the slice starts in q's buffers */
    w->mine.n = v1 - v0, w->mine.offset = q->offset;
    uint8_t **dst[3] = {&w->mine.packed, &w->mine.qabsmax, (uint8_t **)&w->mine.absmax2};
    const uint8_t *src[3] = {q->packed + at / 2, q->qabsmax + at / CTRL_NF4_BLOCK,
                             (const uint8_t *)(q->absmax2 + at / CTRL_NF4_SUPER)};
    for (int k = 0; k < 3; k++) {
        if (!(*dst[k] = calloc(in_floats(w->mine_b[k]) + 1, sizeof(float))))
            return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: an NF4 slice of %lld values", (long long)w->mine.n);
        memcpy(*dst[k], src[k], w->mine_b[k]);
    }
    s->mine_bytes += w->mine_b[0] + w->mine_b[1] + w->mine_b[2];
    s->whole_bytes += w->whole_b[0] + w->whole_b[1] + w->whole_b[2];
    return CTRL_OK;
}

/* A CUDA model: this rank's pieces (cut_weight's, from the host) put in device memory, and the
 * device's whole copy of each weight freed; the gathers then rebuild a layer there. */
static ctrl_status device_cut(struct zero_nf4 *s, ctrl_model *m) {
    void **dstore = ctrl_model_nf4_device(m);
    if (!dstore) return CTRL_OK;
    s->dev = ctrl_model_backend(m), s->dstore = dstore;
    if (!(s->dmine = calloc(3 * (size_t)s->n_w + 1, sizeof(void *))) ||
        !(s->root_whole = calloc((size_t)(s->n_layers > 0 ? s->n_layers : 1), 1)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    ctrl_status st = CTRL_OK;
    size_t freed = 0; /* the device's whole copy (none when the move deferred it) */
    for (int i = 0; i < s->n_w && st == CTRL_OK; i++) {
        const nf4_weight *w = &s->w[i];
        const void *mine[3] = {w->mine.packed, w->mine.qabsmax, w->mine.absmax2};
        for (int k = 0; k < 3 && st == CTRL_OK; k++) {
            st = s->dev->alloc(&s->dmine[3 * i + k], sizeof(float) * (in_floats(w->mine_b[k]) + 1));
            if (st == CTRL_OK && w->mine_b[k])
                st = s->dev->to_device(s->dmine[3 * i + k], mine[k], w->mine_b[k]);
            if (st == CTRL_OK && dstore[3 * w->at + k])
                s->dev->free(dstore[3 * w->at + k]), freed += w->whole_b[k];
            dstore[3 * w->at + k] = NULL;
        }
    }
    if (st != CTRL_OK) return ctrl_error_wrap(st, "zero3: the NF4 base's slices on %s", s->dev->name);
    if (s->rank == 0)
        CTRL_INFO("zero3: the NF4 base's slices put in %s memory; %s", s->dev->name,
                  freed ? "its whole copy there freed (the device held the whole store once)"
                        : "the device never held the whole store");
    return CTRL_OK;
}

void train_zero_nf4_free(train_zero *z) {
    struct zero_nf4 *s = z->nf4;
    if (!s) return;
    for (int i = 0; i < s->n_w; i++) ctrl_nf4_free(&s->w[i].mine), free(s->w[i].counts);
    for (int i = 0; s->dmine && i < 3 * s->n_w; i++)
        if (s->dmine[i]) s->dev->free(s->dmine[i]);
    free(s->w), free(s->layer_at), free(s->state), free(s->pend), free(s->n_pend), free(s->dmine);
    free(s->root_whole), free(s);
    z->nf4 = NULL; /* (the model's store is the model's: it may be gone already) */
}

ctrl_status train_zero_nf4_init(train_zero *z, ctrl_model *m) {
    int per = 0;
    ctrl_nf4 *store = ctrl_model_nf4_store(m, &per);
    if (z->stage < 3 || z->size < 2 || !store) return CTRL_OK; /* one rank: the store stays whole */
    struct zero_nf4 *s = calloc(1, sizeof *s);
    if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    z->nf4 = s;
    s->model = m, s->store = store, s->rank = z->rank, s->size = z->size;
    s->n_layers = ctrl_model_cfg(m)->n_layers;
    const size_t nl = (size_t)(s->n_layers > 0 ? s->n_layers : 1);
    s->per = per;
    if (!(s->w = calloc(nl * (size_t)per, sizeof *s->w)) || !(s->layer_at = calloc(nl + 1, sizeof(int))) ||
        !(s->state = calloc(nl, 1)) || !(s->pend = calloc(nl * 3 * (size_t)per, sizeof(void *))) ||
        !(s->n_pend = calloc(nl, sizeof(int))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    /* QDoRA: the base's row norms from the whole store (DoRA reads the base whole: train_setup.c) */
    ctrl_status st = ctrl_model_nf4_hold_norms(m);
    const int64_t *parts = ctrl_model_nf4_parts(m); /* loaded in pieces (zero_load.c): this rank's */
    for (int l = 0; l < s->n_layers && st == CTRL_OK; l++) {
        s->layer_at[l] = s->n_w;
        for (int t = 0; t < per && st == CTRL_OK; t++) {
            ctrl_nf4 *q = &store[l * per + t];
            if (!q->packed) continue; /* nothing of its own (a fused module's row block, MoE) */
            nf4_weight *w = &s->w[s->n_w++];
            w->at = l * per + t;
            st = cut_weight(s, w, q, parts ? parts + 2 * (size_t)(l * per + t) : NULL);
            if (st == CTRL_OK) ctrl_nf4_free(q); /* the whole weight's buffers: this rank keeps its slice */
        }
    }
    s->layer_at[s->n_layers] = s->n_w;
    if (st == CTRL_OK) st = device_cut(s, m);
    if (st != CTRL_OK) return st;
    if (parts) ctrl_model_nf4_parts_done(m); /* every entry freed: the gathers put them whole */
    double v[3] = {(double)s->mine_bytes, (double)s->mine_bytes, -(double)s->mine_bytes};
    st = ctrl_collective_allreduce_sum_f64(v, 1);
    if (st == CTRL_OK) st = ctrl_collective_allreduce_max_f64(v + 1, 2);
    if (st == CTRL_OK && z->rank == 0)
        CTRL_INFO(
            "zero3: the NF4 base sliced over %d ranks: each rank holds %.0f to %.0f of its %zu bytes "
            "(%zu weights; %.0f over the ranks), a layer's all-gathered around each use and freed after",
            z->size, -v[2], v[1], s->whole_bytes, (size_t)s->n_w, v[0]);
    return st;
}

/* Layer l's pending gathers waited for (all of them, whatever failed). */
static ctrl_status wait_layer(struct zero_nf4 *s, int l) {
    ctrl_status st = CTRL_OK;
    void **pend = s->pend + (size_t)l * 3 * (size_t)s->per;
    for (int i = 0; i < s->n_pend[l]; i++) {
        const ctrl_status sw =
            s->dev ? ctrl_collective_device_allgather_wait(pend[i]) : ctrl_collective_allgather_wait(pend[i]);
        if (st == CTRL_OK) st = sw;
        pend[i] = NULL;
    }
    s->n_pend[l] = 0;
    return st;
}

/* A CUDA model's layer l: each part's whole buffer allocated in device memory, this rank's piece copied
 * into its place and the buffer all-gathered over NCCL on the communication stream (queued after the
 * copy), the handles in pend; the device store points at the buffers (the products read them once
 * train_zero_nf4_gather waited). */
static ctrl_status device_start(struct zero_nf4 *s, int l, void **pend) {
    ctrl_status st = CTRL_OK;
    for (int i = s->layer_at[l]; i < s->layer_at[l + 1] && st == CTRL_OK; i++) {
        const nf4_weight *w = &s->w[i];
        s->store[w->at].n = w->n, s->store[w->at].offset = w->offset; /* (what the products read) */
        for (int k = 0; k < 3 && st == CTRL_OK; k++) {
            void **d = &s->dstore[3 * w->at + k];
            st = s->dev->alloc(d, sizeof(float) * (w->floats[k] + 1));
            if (st == CTRL_OK && w->mine_b[k])
                st = s->dev->copy((char *)*d + sizeof(float) * w->pos[k], s->dmine[3 * i + k], w->mine_b[k]);
            if (st == CTRL_OK)
                st = ctrl_collective_device_allgather_start_f32(*d, w->counts + k * s->size,
                                                                &pend[s->n_pend[l]++]);
        }
    }
    return st == CTRL_OK ? CTRL_OK
                         : ctrl_error_wrap(st, "zero3: layer %d's NF4 weights on %s", l, s->dev->name);
}

ctrl_status train_zero_nf4_start(train_zero *z, int l) {
    struct zero_nf4 *s = z->nf4;
    if (!s || l < 0 || l >= s->n_layers || s->state[l]) return CTRL_OK;
    void **pend = s->pend + (size_t)l * 3 * (size_t)s->per;
    ctrl_status st = CTRL_OK;
    s->state[l] = 1; /* (on an error too: the release frees what was allocated) */
    if (s->dev) {
        s->gathers++;
        return device_start(s, l, pend);
    }
    for (int i = s->layer_at[l]; i < s->layer_at[l + 1] && st == CTRL_OK; i++) {
        const nf4_weight *w = &s->w[i];
        ctrl_nf4 *q = &s->store[w->at];
        uint8_t **dst[3] = {&q->packed, &q->qabsmax, (uint8_t **)&q->absmax2};
        const uint8_t *mine[3] = {w->mine.packed, w->mine.qabsmax, (const uint8_t *)w->mine.absmax2};
        q->n = w->n, q->offset = w->offset;
        for (int k = 0; k < 3 && st == CTRL_OK; k++) {
            if (!(*dst[k] = malloc(sizeof(float) * (w->floats[k] + 1)))) {
                st = ctrl_error_set(CTRL_ERR_NOMEM, "zero3: layer %d's NF4 weights (%zu bytes)", l,
                                    sizeof(float) * w->floats[k]);
                break;
            }
            memcpy(*dst[k] + sizeof(float) * w->pos[k], mine[k], w->mine_b[k]);
            st = ctrl_collective_allgather_start_f32((float *)*dst[k], w->counts + k * s->size,
                                                     &pend[s->n_pend[l]++]);
        }
    }
    s->gathers++;
    return st;
}

ctrl_status train_zero_nf4_gather(train_zero *z, int l) {
    struct zero_nf4 *s = z->nf4;
    if (!s || l < 0 || l >= s->n_layers || s->state[l] == 2) return CTRL_OK;
    ctrl_status st = train_zero_nf4_start(z, l); /* (prefetched: started already) */
    const ctrl_status sw = wait_layer(s, l);
    s->state[l] = 2;
    return st == CTRL_OK ? sw : st;
}

ctrl_status train_zero_nf4_gather_root(train_zero *z, int l) {
    struct zero_nf4 *s = z->nf4;
    if (!s || l < 0 || l >= s->n_layers) return CTRL_OK;
    /* (the same state on every rank; a device model's save reads rank 0's host store: gathered there
     * whatever its device holds) */
    if (s->dev ? s->root_whole[l] : s->state[l]) return s->dev ? CTRL_OK : train_zero_nf4_gather(z, l);
    ctrl_status st = CTRL_OK;
    for (int i = s->layer_at[l]; i < s->layer_at[l + 1] && st == CTRL_OK; i++) {
        const nf4_weight *w = &s->w[i];
        ctrl_nf4 *q = &s->store[w->at];
        uint8_t **dst[3] = {&q->packed, &q->qabsmax, (uint8_t **)&q->absmax2};
        const uint8_t *mine[3] = {w->mine.packed, w->mine.qabsmax, (const uint8_t *)w->mine.absmax2};
        for (int k = 0; k < 3 && st == CTRL_OK; k++) {
            /* the whole part's buffer on every rank (the gather's layout), touched on the others only
             * where their piece lies, and freed at once there */
            uint8_t *buf = malloc(sizeof(float) * (w->floats[k] + 1));
            if (!buf) {
                st = ctrl_error_set(CTRL_ERR_NOMEM, "zero3: layer %d's NF4 weights (%zu bytes)", l,
                                    sizeof(float) * w->floats[k]);
                break;
            }
            memcpy(buf + sizeof(float) * w->pos[k], mine[k], w->mine_b[k]);
            st = ctrl_collective_gather_f32((float *)buf, w->counts + k * s->size, 0);
            if (s->rank == 0)
                *dst[k] = buf;
            else
                free(buf);
        }
        if (s->rank == 0) q->n = w->n, q->offset = w->offset;
    }
    if (s->rank == 0 && s->dev)
        s->root_whole[l] = 1; /* (released with the layer) */
    else if (s->rank == 0)
        s->state[l] = 2; /* (released with the layer, as a use's gather) */
    s->gathers++;
    return st;
}

size_t train_zero_nf4_floats(const train_zero *z, int l) {
    const struct zero_nf4 *s = z->nf4;
    size_t n = 0;
    for (int i = s && l >= 0 && l < s->n_layers ? s->layer_at[l] : 0; s && i < s->layer_at[l + 1]; i++)
        n += s->w[i].floats[0] + s->w[i].floats[1] + s->w[i].floats[2];
    return n;
}

void train_zero_nf4_release(train_zero *z, int l) {
    struct zero_nf4 *s = z->nf4;
    if (!s || l < 0 || l >= s->n_layers) return;
    if (s->dev && s->root_whole[l]) { /* rank 0's host copy a streamed save gathered */
        for (int i = s->layer_at[l]; i < s->layer_at[l + 1]; i++) ctrl_nf4_free(&s->store[s->w[i].at]);
        s->root_whole[l] = 0;
    }
    if (!s->state[l]) return;
    if (wait_layer(s, l) != CTRL_OK) /* (a prefetch never used: its buffers are written until done) */
        CTRL_ERROR("zero3: %s", ctrl_error_message());
    if (s->dev && s->dev->synchronize() != CTRL_OK) /* the kernels that read the layer are done */
        CTRL_ERROR("zero3: %s", ctrl_error_message());
    for (int i = s->layer_at[l]; i < s->layer_at[l + 1]; i++) {
        if (!s->dev) {
            ctrl_nf4_free(&s->store[s->w[i].at]);
            continue;
        }
        for (int k = 0; k < 3; k++) {
            void **d = &s->dstore[3 * s->w[i].at + k];
            if (*d) s->dev->free(*d);
            *d = NULL;
        }
    }
    s->state[l] = 0;
}

ctrl_status train_zero_nf4_report(train_zero *z) {
    struct zero_nf4 *s = z->nf4;
    if (!s) return CTRL_OK;
    double held = (double)s->mine_bytes; /* the slices, and what the store holds now (layers whole) */
    for (int i = 0; i < s->n_w; i++) {   /* (a device model: the device's; its host store is a save's) */
        const int whole = s->dev ? s->dstore[3 * s->w[i].at] != NULL : s->store[s->w[i].at].packed != NULL;
        if (whole) held += (double)(s->w[i].whole_b[0] + s->w[i].whole_b[1] + s->w[i].whole_b[2]);
    }
    ctrl_status st = ctrl_collective_allreduce_max_f64(&held, 1);
    if (st == CTRL_OK && z->rank == 0)
        CTRL_INFO(
            "zero3: the NF4 base between steps: at most %.0f of its %zu bytes held per rank%s; %ld layer "
            "gathers of it so far",
            held, s->whole_bytes, s->dev ? " in device memory" : "", s->gathers);
    return st;
}
