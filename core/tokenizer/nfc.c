/* Unicode NFC (canonical decomposition, canonical ordering, canonical composition), as the
 * Qwen tokenizers' normalizer applies it. Tables: nfc_tables.c, generated from unicodedata. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/nfc_tables.h"
#include "tokenizer/tokenizer_internal.h"

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28
};
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static int ccc_of(uint32_t cp) {
    int lo = 0, hi = nfc_ccc_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (nfc_ccc[mid].cp == cp) return nfc_ccc[mid].ccc;
        if (nfc_ccc[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

static const nfc_decomp_entry *decomp_of(uint32_t cp) {
    int lo = 0, hi = nfc_decomp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (nfc_decomp[mid].cp == cp) return &nfc_decomp[mid];
        if (nfc_decomp[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    int lo = 0, hi = nfc_comp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const nfc_comp_entry *e = &nfc_comp[mid];
        if (e->first == a && e->second == b) return e->composite;
        if (e->first < a || (e->first == a && e->second < b))
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

char *tok_nfc(const char *s, size_t n, size_t *out_n) {
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    if (ascii) { /* NFC leaves ASCII unchanged */
        char *o = malloc(n + 1);
        if (!o) return NULL;
        memcpy(o, s, n);
        o[n] = '\0';
        *out_n = n;
        return o;
    }
    /* Decode and decompose (each code point expands to at most 4: Hangul 3, tables fewer). */
    uint32_t *cps = malloc(sizeof(uint32_t) * (n * 4 + 1));
    if (!cps) return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = tok_utf8_decode(s, n, &i);
        if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t si = cp - SBASE;
            cps[m++] = LBASE + si / NCOUNT;
            cps[m++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT) cps[m++] = TBASE + si % TCOUNT;
            continue;
        }
        const nfc_decomp_entry *d = decomp_of(cp);
        if (d)
            for (int k = 0; k < d->len; k++) cps[m++] = nfc_decomp_data[d->offset + k];
        else
            cps[m++] = cp;
    }
    /* Canonical ordering: stable sort of each run of non-starters by combining class. */
    for (size_t i = 1; i < m; i++) {
        int c = ccc_of(cps[i]);
        if (!c) continue;
        for (size_t j = i; j > 0; j--) {
            int p = ccc_of(cps[j - 1]);
            if (p <= c) break;
            uint32_t t = cps[j];
            cps[j] = cps[j - 1], cps[j - 1] = t;
        }
    }
    /* Composition (UAX #15): each character joins the last starter unless a character of the same
     * or higher class stands between them. A leading non-starter gets class 256: nothing composes. */
    size_t w = m ? 1 : 0, starter = 0;
    int last = m ? ccc_of(cps[0]) : 0;
    if (last) last = 256;
    for (size_t i = 1; i < m; i++) {
        const uint32_t cp = cps[i];
        const int c = ccc_of(cp);
        const uint32_t comp = compose(cps[starter], cp);
        if (comp && (last < c || last == 0)) {
            cps[starter] = comp;
            continue;
        }
        if (c == 0) starter = w;
        last = c;
        cps[w++] = cp;
    }
    char *o = malloc(w * 4 + 1);
    if (!o) {
        free(cps);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < w; i++) k += tok_utf8_encode(cps[i], o + k);
    o[k] = '\0';
    free(cps);
    *out_n = k;
    return o;
}
