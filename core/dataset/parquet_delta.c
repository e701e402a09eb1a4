/* Parquet's other value encodings (parquet_internal.h), from the specification: DELTA_BINARY_PACKED
 * (a header of block size, miniblocks per block, value count and first value, then blocks of a
 * minimum delta, one bit width per miniblock and the bit-packed deltas above the minimum),
 * DELTA_LENGTH_BYTE_ARRAY (the lengths delta-packed, then the bytes), DELTA_BYTE_ARRAY (prefix
 * lengths shared with the previous value, then the suffixes as DELTA_LENGTH_BYTE_ARRAY) and
 * BYTE_STREAM_SPLIT (byte k of every value, then byte k + 1...). Integer arithmetic wraps as the
 * writers' does (unsigned), and every read is bounded. */
#include <stdlib.h>
#include <string.h>

#include "dataset/parquet_internal.h"

#define PQ_MAX_OWNED ((uint64_t)1 << 30) /* bytes a DELTA_BYTE_ARRAY page may rebuild */

static int uleb(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end) return 0;
        const uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

/* bw (0..64) bits at bit position `bit` of p[0..n) (the caller checked they lie inside). */
static uint64_t bits_at(const uint8_t *p, uint64_t bit, int bw) {
    uint64_t v = 0;
    for (int got = 0; got < bw;) {
        const uint64_t at = bit + (uint64_t)got;
        const int off = (int)(at & 7), take = 8 - off < bw - got ? 8 - off : bw - got;
        v |= (uint64_t)((p[at >> 3] >> off) & ((1u << take) - 1)) << got;
        got += take;
    }
    return v;
}

/* `count` integers of DELTA_BINARY_PACKED at *p (advanced past them). */
static const char *delta_ints(const uint8_t **p, const uint8_t *end, int64_t count, int64_t *out) {
    uint64_t block, minis, total, first;
    if (!uleb(p, end, &block) || !uleb(p, end, &minis) || !uleb(p, end, &total) || !uleb(p, end, &first))
        return "a DELTA_BINARY_PACKED header ends early";
    if (block == 0 || block % 128 || minis == 0 || block % minis || (block / minis) % 32 ||
        block > (1u << 20))
        return "a DELTA_BINARY_PACKED header with a bad block size";
    if (total != (uint64_t)count) return "a DELTA_BINARY_PACKED run with the wrong value count";
    if (count == 0) return NULL;
    const uint64_t per_mini = block / minis;
    uint64_t prev = (first >> 1) ^ (0 - (first & 1));
    out[0] = (int64_t)prev;
    int64_t k = 1;
    while (k < count) {
        uint64_t md;
        if (!uleb(p, end, &md)) return "a DELTA_BINARY_PACKED block ends early";
        const uint64_t min_delta = (md >> 1) ^ (0 - (md & 1));
        if ((uint64_t)(end - *p) < minis) return "a DELTA_BINARY_PACKED block ends early";
        const uint8_t *widths = *p;
        *p += minis;
        for (uint64_t m = 0; m < minis && k < count; m++) {
            const int bw = widths[m];
            if (bw > 64) return "a DELTA_BINARY_PACKED bit width over 64";
            const uint64_t bytes = per_mini * (uint64_t)bw / 8;
            if (bytes > (uint64_t)(end - *p)) return "a DELTA_BINARY_PACKED miniblock ends early";
            for (uint64_t i = 0; i < per_mini && k < count; i++) {
                prev = prev + min_delta + bits_at(*p, i * (uint64_t)bw, bw);
                out[k++] = (int64_t)prev;
            }
            *p += bytes;
        }
    }
    return NULL;
}

/* `count` lengths then the bytes (DELTA_LENGTH_BYTE_ARRAY) at *p into dst. */
static const char *delta_lengths(const uint8_t **p, const uint8_t *end, int64_t count, pq_value *dst) {
    int64_t *len = malloc(((size_t)count + 1) * sizeof *len);
    if (!len) return "out of memory";
    const char *why = delta_ints(p, end, count, len);
    for (int64_t i = 0; !why && i < count; i++) {
        if (len[i] < 0 || (uint64_t)len[i] > (uint64_t)(end - *p) || len[i] > UINT32_MAX) {
            why = "a byte array runs past its page";
            break;
        }
        dst[i] = (pq_value){.s = *p, .len = (uint32_t)len[i]};
        *p += len[i];
    }
    free(len);
    return why;
}

const char *pq_other_values(const pq_node *leaf, int enc, const uint8_t *p, size_t n, int64_t count,
                            pq_value *dst, uint8_t **owned) {
    const uint8_t *end = p + n;
    *owned = NULL;
    const int ints = leaf->type == PQ_INT32 || leaf->type == PQ_INT64;
    const int bytes = leaf->type == PQ_BYTE_ARRAY;
    if (enc == 5 && ints) { /* DELTA_BINARY_PACKED */
        int64_t *v = malloc(((size_t)count + 1) * sizeof *v);
        if (!v) return "out of memory";
        const char *why = delta_ints(&p, end, count, v);
        for (int64_t i = 0; !why && i < count; i++)
            dst[i] = (pq_value){.i = leaf->type == PQ_INT32 ? (leaf->int_unsigned ? (int64_t)(uint32_t)v[i]
                                                                                  : (int64_t)(int32_t)v[i])
                                                            : v[i]};
        free(v);
        return why;
    }
    if (enc == 6 && bytes) return delta_lengths(&p, end, count, dst); /* DELTA_LENGTH_BYTE_ARRAY */
    if (enc == 7 && (bytes || leaf->type == PQ_FIXED)) {              /* DELTA_BYTE_ARRAY */
        int64_t *pre = malloc(((size_t)count + 1) * sizeof *pre);
        if (!pre) return "out of memory";
        const char *why = delta_ints(&p, end, count, pre);
        if (!why) why = delta_lengths(&p, end, count, dst);
        uint64_t total = 0, prev_len = 0;
        for (int64_t i = 0; !why && i < count; i++) {
            if (pre[i] < 0 || (uint64_t)pre[i] > prev_len)
                why = "a DELTA_BYTE_ARRAY prefix longer than the value before";
            else if ((total += (uint64_t)pre[i] + dst[i].len) > PQ_MAX_OWNED)
                why = "a DELTA_BYTE_ARRAY page over 1 GiB";
            else
                prev_len = (uint64_t)pre[i] + dst[i].len;
        }
        uint8_t *buf = why ? NULL : malloc((size_t)total + 1);
        if (!why && !buf) why = "out of memory";
        uint64_t at = 0;
        for (int64_t i = 0; !why && i < count; i++) { /* the previous value's prefix, then the suffix */
            const uint64_t start = at;
            if (pre[i]) memcpy(buf + at, dst[i - 1].s, (size_t)pre[i]);
            at += (uint64_t)pre[i];
            if (dst[i].len) memcpy(buf + at, dst[i].s, dst[i].len);
            at += dst[i].len;
            dst[i] = (pq_value){.s = buf + start, .len = (uint32_t)(at - start)};
            if (leaf->type == PQ_FIXED && dst[i].len != (uint32_t)leaf->type_length)
                why = "a value of the wrong width";
        }
        free(pre);
        if (why) return free(buf), why;
        *owned = buf;
        return NULL;
    }
    const int w = leaf->type == PQ_INT32 || leaf->type == PQ_FLOAT    ? 4
                  : leaf->type == PQ_INT64 || leaf->type == PQ_DOUBLE ? 8
                  : leaf->type == PQ_FIXED                            ? leaf->type_length
                                                                      : 0;
    if (enc == 9 && w) { /* BYTE_STREAM_SPLIT: gathered back into PLAIN order */
        if ((uint64_t)count * (uint64_t)w > n) return "BYTE_STREAM_SPLIT values end early";
        uint8_t *buf = malloc((size_t)count * (size_t)w + 1);
        if (!buf) return "out of memory";
        for (int64_t i = 0; i < count; i++)
            for (int b = 0; b < w; b++) buf[i * w + b] = p[(size_t)b * (size_t)count + (size_t)i];
        const char *why = pq_plain_values(leaf, buf, (size_t)count * (size_t)w, count, dst);
        if (why) return free(buf), why;
        *owned = buf;
        return NULL;
    }
    return enc >= 5 && enc <= 9 ? "a value encoding this column's type does not take"
                                : "an unknown value encoding";
}
