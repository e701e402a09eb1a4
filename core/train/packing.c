/* Packing with TRL's semantics (trl/data_utils.py pack_dataset), applied per group of 1000
 * examples as TRL's batched dataset map does:
 * - bfd: empty sequences dropped, each truncated to the pack length, sorted by length (descending,
 *   stable), each put into the open bin with the least room that still fits (the oldest such bin
 *   when several have that room), else into a new bin; bins keep creation order;
 * - bfd_split: the same, but a long sequence is first cut into pack-length fragments (the last one
 *   shorter), each fragment a sequence of its own;
 * - wrapped: the group's token stream cut into pack-length blocks, each block one sequence.
 * A packed example keeps its sequences as segments: positions restart and nothing is predicted
 * across a segment boundary. */
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

enum { PACK_GROUP = 1000 }; /* datasets.map(batched=True) default batch size */

typedef struct seq_ref {
    int ex, off, len; /* a slice of an input example */
} seq_ref;

typedef struct bin {
    int *seqs, n, cap, used;
} bin;

/* Max segment tree over room values 1..cap: finds the smallest room >= need among open bins. */
typedef struct room_tree {
    int size;
    int *t;
} room_tree;

static void tree_set(room_tree *rt, int room, int on) {
    int i = rt->size + room - 1;
    rt->t[i] = on ? room : 0;
    for (i >>= 1; i >= 1; i >>= 1)
        rt->t[i] = rt->t[2 * i] >= rt->t[2 * i + 1] ? rt->t[2 * i] : rt->t[2 * i + 1];
}

static int tree_search(const room_tree *rt, int need) { /* leftmost leaf with value >= need */
    int i = 1;
    while (i < rt->size) i = rt->t[2 * i] >= need ? 2 * i : 2 * i + 1;
    return rt->t[i];
}

/* FIFO of bins per room value. */
typedef struct room_queue {
    int *b, head, n, cap;
} room_queue;

/* 0, or -1 when out of memory (the queue unchanged). */
static int queue_push(room_queue *q, int b) {
    if (q->head + q->n == q->cap) {
        if (q->head > 0) {
            memmove(q->b, q->b + q->head, sizeof(int) * (size_t)q->n);
            q->head = 0;
        } else {
            const int cap = q->cap ? 2 * q->cap : 4;
            int *more = realloc(q->b, sizeof(int) * (size_t)cap);
            if (!more) return -1;
            q->b = more, q->cap = cap;
        }
    }
    q->b[q->head + q->n++] = b;
    return 0;
}

static int queue_pop(room_queue *q) {
    int b = q->b[q->head++];
    q->n--;
    return b;
}

static int cmp_len_desc(const void *a, const void *b) {
    const seq_ref *x = a, *y = b;
    if (x->len != y->len) return y->len - x->len;
    return x->ex != y->ex ? x->ex - y->ex : x->off - y->off; /* stable: input order */
}

static ctrl_status emit(ctrl_dataset *out, const ctrl_dataset *in, const seq_ref *seqs, const int *order,
                        int n) {
    int len = 0;
    for (int k = 0; k < n; k++) len += seqs[order[k]].len;
    if ((out->n & (out->n - 1)) == 0) {
        ctrl_example *e = realloc(out->ex, sizeof *e * (size_t)(out->n ? 2 * out->n : 1));
        if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "packing: out of memory");
        out->ex = e;
    }
    ctrl_example *e = &out->ex[out->n++];
    *e = (ctrl_example){.ids = malloc(sizeof(int32_t) * (size_t)len),
                        .trained = malloc((size_t)len),
                        .len = len,
                        .seg = malloc(sizeof(int) * (size_t)n),
                        .n_seg = n};
    if (!e->ids || !e->trained || !e->seg) return ctrl_error_set(CTRL_ERR_NOMEM, "packing: out of memory");
    int at = 0;
    for (int k = 0; k < n; k++) {
        const seq_ref *s = &seqs[order[k]];
        memcpy(e->ids + at, in->ex[s->ex].ids + s->off, sizeof(int32_t) * (size_t)s->len);
        memcpy(e->trained + at, in->ex[s->ex].trained + s->off, (size_t)s->len);
        e->seg[k] = s->len;
        at += s->len;
    }
    return CTRL_OK;
}

static ctrl_status pack_bfd(ctrl_dataset *out, const ctrl_dataset *in, int g0, int g1, int L, int split) {
    int n = 0, cap = 0, nomem = 0;
    seq_ref *seqs = NULL;
    for (int i = g0; i < g1 && !nomem; i++) {
        const int len = in->ex[i].len;
        for (int off = 0; off < len && !nomem; off += L) {
            if (n == cap) {
                seq_ref *more = realloc(seqs, sizeof *seqs * (size_t)(cap ? 2 * cap : 64));
                if ((nomem = !more)) break;
                seqs = more, cap = cap ? 2 * cap : 64;
            }
            seqs[n++] = (seq_ref){i, off, len - off < L ? len - off : L};
            if (!split) break; /* bfd: the overflow is dropped */
        }
    }
    if (!nomem) qsort(seqs, (size_t)n, sizeof *seqs, cmp_len_desc);
    room_tree rt = {.size = 1};
    while (rt.size < L) rt.size <<= 1;
    rt.t = calloc(2 * (size_t)rt.size, sizeof(int));
    room_queue *rooms = calloc((size_t)L + 1, sizeof *rooms);
    bin *bins = NULL;
    int n_bins = 0, bins_cap = 0;
    nomem |= !rt.t || !rooms;
    if (!nomem) tree_set(&rt, L, 1); /* a fresh bin always has room L */
    for (int s = 0; s < n && !nomem; s++) {
        const int len = seqs[s].len, room = tree_search(&rt, len);
        int b;
        if (room < L) {
            b = queue_pop(&rooms[room]);
            if (rooms[room].n == 0) tree_set(&rt, room, 0);
        } else {
            if (n_bins == bins_cap) {
                bin *more = realloc(bins, sizeof *bins * (size_t)(bins_cap ? 2 * bins_cap : 16));
                if ((nomem = !more)) break;
                bins = more, bins_cap = bins_cap ? 2 * bins_cap : 16;
            }
            b = n_bins++;
            bins[b] = (bin){0};
        }
        bin *B = &bins[b];
        if (B->n == B->cap) {
            int *more = realloc(B->seqs, sizeof(int) * (size_t)(B->cap ? 2 * B->cap : 4));
            if ((nomem = !more)) break;
            B->seqs = more, B->cap = B->cap ? 2 * B->cap : 4;
        }
        B->seqs[B->n++] = s;
        B->used += len;
        const int left = L - B->used;
        if ((nomem = queue_push(&rooms[left], b) != 0)) break; /* a full bin (left 0) is never searched */
        if (left > 0) tree_set(&rt, left, 1);
    }
    ctrl_status st = nomem ? ctrl_error_set(CTRL_ERR_NOMEM, "packing: out of memory") : CTRL_OK;
    for (int b = 0; b < n_bins && st == CTRL_OK; b++) st = emit(out, in, seqs, bins[b].seqs, bins[b].n);
    for (int b = 0; b < n_bins; b++) free(bins[b].seqs);
    for (int r = 0; rooms && r <= L; r++) free(rooms[r].b);
    free(bins), free(rooms), free(rt.t), free(seqs);
    return st;
}

static ctrl_status pack_wrapped(ctrl_dataset *out, const ctrl_dataset *in, int g0, int g1, int L) {
    long total = 0;
    for (int i = g0; i < g1; i++) total += in->ex[i].len;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    uint8_t *tr = malloc((size_t)(total ? total : 1));
    if (!ids || !tr) {
        free(ids), free(tr);
        return ctrl_error_set(CTRL_ERR_NOMEM, "packing: out of memory for %ld tokens", total);
    }
    long at = 0;
    for (int i = g0; i < g1; i++) {
        memcpy(ids + at, in->ex[i].ids, sizeof(int32_t) * (size_t)in->ex[i].len);
        memcpy(tr + at, in->ex[i].trained, (size_t)in->ex[i].len);
        at += in->ex[i].len;
    }
    /* each block is one example of one segment: it is one sequence to the model, as in TRL */
    ctrl_dataset block = {.ex = &(ctrl_example){0}, .n = 1};
    ctrl_status st = CTRL_OK;
    for (long o = 0; o < total && st == CTRL_OK; o += L) {
        const int len = total - o < L ? (int)(total - o) : L;
        block.ex[0] = (ctrl_example){.ids = ids + o, .trained = tr + o, .len = len};
        seq_ref one = {0, 0, len};
        int order = 0;
        st = emit(out, &block, &one, &order, 1);
    }
    free(ids), free(tr);
    return st;
}

ctrl_status ctrl_dataset_pack(ctrl_dataset *d, int seq_length, const char *strategy) {
    const int split = !strcmp(strategy, "bfd_split"), wrapped = !strcmp(strategy, "wrapped");
    if (!wrapped && !split && strcmp(strategy, "bfd") != 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[data] packing_strategy = %s: expected bfd, bfd_split or wrapped", strategy);
    ctrl_dataset out = {
        .skipped_bad = d->skipped_bad, .dropped_empty = d->dropped_empty, .truncated = d->truncated};
    ctrl_status st = CTRL_OK;
    for (int g0 = 0; g0 < d->n && st == CTRL_OK; g0 += PACK_GROUP) {
        const int g1 = g0 + PACK_GROUP < d->n ? g0 + PACK_GROUP : d->n;
        st = wrapped ? pack_wrapped(&out, d, g0, g1, seq_length)
                     : pack_bfd(&out, d, g0, g1, seq_length, split);
    }
    if (st != CTRL_OK) {
        ctrl_dataset_free(&out);
        return st;
    }
    out.packed_from = d->n;
    ctrl_dataset_free(d);
    *d = out;
    return CTRL_OK;
}

double ctrl_dataset_fill_rate(const ctrl_dataset *d, int seq_length) {
    long tokens = 0;
    for (int i = 0; i < d->n; i++) tokens += d->ex[i].len;
    return d->n ? (double)tokens / ((double)d->n * seq_length) : 0;
}
