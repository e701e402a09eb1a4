/* Byte-pair encoding of one pre-token, as the `tokenizers` library's BPE model does without
 * dropout: the characters' ids (byte tokens or unk for characters outside the vocabulary), then a
 * min-heap of adjacent pairs by (merge rank, position); a popped entry whose pair changed since it
 * was pushed still merges when the new pair makes the same token (the library's staleness test),
 * so this is the library's merge order exactly. With ignore_merges (Llama-3), a word that is itself
 * in the vocabulary is taken whole. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "interrupt.h"
#include "tokenizer/tokenizer_internal.h"

static int push(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return -1;
        *ids = p, *cap = c;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

static int32_t merge_rank(const ctrl_tokenizer *t, int32_t a, int32_t b) {
    return tok_pairs_get(&t->merges, a, b);
}

typedef struct pair_entry {
    int32_t rank, pos;
} pair_entry;

static int before(pair_entry a, pair_entry b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(pair_entry *h, size_t *n, pair_entry e) {
    size_t i = (*n)++;
    while (i > 0 && before(e, h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = e;
}

static pair_entry heap_pop(pair_entry *h, size_t *n) {
    pair_entry top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(h[c + 1], h[c])) c++;
        if (!before(h[c], last)) break;
        h[i] = h[c], i = c;
    }
    h[i] = last;
    return top;
}

/* The initial symbols: one per character; a character missing from the vocabulary becomes its
 * <0xXX> byte tokens when all exist (byte_fallback), else unk — held back until the next
 * vocabulary character or the end and fused with following unknowns under fuse_unk, as the
 * library does (byte tokens in between do not release it) — else it is dropped. Returns the
 * count, -1 when a byte-level character is missing (a malformed tokenizer), -2 when the named
 * unk_token is not in the vocabulary (the library's UnkTokenOutOfVocabulary). */
static long initial_symbols(const ctrl_tokenizer *t, const char *word, size_t len, int32_t *sym) {
    size_t k = 0;
    int unk_pending = 0;
    for (size_t i = 0; i < len;) {
        size_t start = i;
        tok_utf8_decode(word, len, &i);
        int32_t id = tok_map_get(&t->vocab, word + start, i - start);
        if (id >= 0) {
            if (unk_pending) sym[k++] = t->unk_id, unk_pending = 0;
            sym[k++] = id;
            continue;
        }
        if (t->byte_fallback) {
            int all = 1;
            for (size_t b = start; b < i; b++) all &= t->byte_id[(unsigned char)word[b]] >= 0;
            if (all) {
                for (size_t b = start; b < i; b++) sym[k++] = t->byte_id[(unsigned char)word[b]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) sym[k++] = t->unk_id;
            unk_pending = 1;
        } else if (t->unk_missing) {
            return -2;
        } else if (t->byte_level) {
            return -1;
        }
    }
    if (unk_pending) sym[k++] = t->unk_id;
    return (long)k;
}

/* The merges of one run of symbols sym[0..k) (next/prev/alive: its links, indices into the run),
 * in the library's order; `pops` counts heap pops across runs for the interruption poll. Returns
 * 0, or -3 when interrupted. */
static int merge_run(const ctrl_tokenizer *t, int32_t *sym, long k, int32_t *next, int32_t *prev,
                     int32_t *alive, pair_entry *heap, size_t *pops) {
    size_t nh = 0;
    for (long i = 0; i < k; i++) {
        next[i] = i + 1 < k ? (int32_t)i + 1 : -1, prev[i] = (int32_t)i - 1, alive[i] = 1;
        int32_t r = i + 1 < k ? merge_rank(t, sym[i], sym[i + 1]) : -1;
        if (r >= 0) heap_push(heap, &nh, (pair_entry){r, (int32_t)i});
    }
    while (nh) {
        if (++*pops % TOK_POLL_MERGES == 0 && ctrl_interrupt_requested()) return -3;
        pair_entry top = heap_pop(heap, &nh);
        const int32_t p = top.pos, q = next[p];
        if (!alive[p] || q < 0) continue;
        const int32_t now = merge_rank(t, sym[p], sym[q]);
        if (now < 0 || t->merge_result[now] != t->merge_result[top.rank]) continue; /* stale */
        sym[p] = t->merge_result[top.rank];
        alive[q] = 0, next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        int32_t r;
        if (prev[p] >= 0 && (r = merge_rank(t, sym[prev[p]], sym[p])) >= 0)
            heap_push(heap, &nh, (pair_entry){r, prev[p]});
        if (next[p] >= 0 && (r = merge_rank(t, sym[p], sym[next[p]])) >= 0)
            heap_push(heap, &nh, (pair_entry){r, p});
    }
    return 0;
}

/* Where a long word may be cut (tok_bpe): before symbol i when no merge can ever join sym[i - 1]
 * and sym[i] (tok_joinable), so each run merges exactly as inside the whole word. */
static int cut_before(const ctrl_tokenizer *t, const int32_t *sym, long i) {
    return t->can_cut && tok_pairs_get(&t->joinable, sym[i - 1], sym[i]) < 0;
}

int tok_bpe(const ctrl_tokenizer *t, const char *word, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    if (t->ignore_merges) {
        int32_t whole = tok_map_get(&t->vocab, word, len);
        if (whole >= 0) return push(ids, n, cap, whole);
    }
    /* at most one symbol per byte (byte fallback) + one unk; the heap holds at most 3 per symbol of
     * the longest run */
    enum { LOCAL = 64, CUT_MIN = 256 };
    int32_t local_sym[4 * LOCAL];
    pair_entry local_heap[3 * LOCAL];
    const size_t m = len + 1;
    int32_t *sym = m <= LOCAL ? local_sym : malloc(sizeof(int32_t) * 4 * m);
    pair_entry *heap = local_heap;
    int rc = 0;
    if (!sym) return -1;
    long k = initial_symbols(t, word, len, sym);
    if (k < 0) {
        rc = (int)k;
        goto done;
    }
    /* A long word (a line without a pre-tokenizer, a run of letters) is merged in runs between
     * the places where no merge can join its neighbours: the same result, in time linear in the
     * word and with a heap the size of the longest run. */
    const int cut = k > CUT_MIN;
    long longest = 0;
    for (long i = 1, start = 0; i <= k; i++)
        if (i == k || (cut && cut_before(t, sym, i))) {
            if (i - start > longest) longest = i - start;
            start = i;
        }
    if ((size_t)longest > LOCAL && !(heap = malloc(sizeof(pair_entry) * 3 * ((size_t)longest + 1)))) {
        rc = -1;
        goto done;
    }
    int32_t *next = sym + m, *prev = sym + 2 * m, *alive = sym + 3 * m;
    size_t pops = 0;
    for (long i = 1, start = 0; i <= k && rc == 0; i++)
        if (i == k || (cut && cut_before(t, sym, i))) {
            rc = merge_run(t, sym + start, i - start, next + start, prev + start, alive + start, heap, &pops);
            start = i;
        }
    for (long i = 0; i < k && rc == 0; i++)
        if (alive[i]) rc = push(ids, n, cap, sym[i]);
done:
    if (sym != local_sym) free(sym);
    if (heap != local_heap) free(heap);
    return rc;
}

/* The last (or first) character of a token as the id of that one-character token; -1 if none. */
static int32_t end_char(const ctrl_tokenizer *t, int32_t id, int last) {
    const char *s = id >= 0 && id < t->n_ids ? t->id_to_token[id] : NULL;
    if (!s || !s[0]) return -1;
    size_t n = strlen(s), b = 0, e = n;
    if (last) {
        b = n - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    } else {
        size_t i = 0;
        tok_utf8_decode(s, n, &i);
        e = i;
    }
    return tok_map_get(&t->vocab, s + b, e - b);
}

static int byte_token_name(const char *s) {
    return s && strlen(s) == 6 && !memcmp(s, "<0x", 3) && s[5] == '>';
}

ctrl_status tok_index_joinable(ctrl_tokenizer *t) {
    size_t count = 0;
    for (size_t j = 0; j < t->merges.cap; j++) count += t->merges.keys[j] != UINT64_MAX;
    if (tok_pairs_init(&t->joinable, count + 16) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: merges");
    t->can_cut = 1;
    for (size_t j = 0; j < t->merges.cap && t->can_cut; j++) {
        const uint64_t key = t->merges.keys[j];
        if (key == UINT64_MAX) continue;
        const int32_t a = (int32_t)(key >> 32), b = (int32_t)(key & 0xFFFFFFFFu);
        /* a merge of unk or a byte token joins symbols that are not characters: no cuts then */
        const int32_t la = end_char(t, a, 1), fb = end_char(t, b, 0);
        if (a == t->unk_id || b == t->unk_id || byte_token_name(t->id_to_token[a]) ||
            byte_token_name(t->id_to_token[b]) || la < 0 || fb < 0)
            t->can_cut = 0;
        else
            tok_pairs_put(&t->joinable, la, fb, 1);
    }
    return CTRL_OK;
}
