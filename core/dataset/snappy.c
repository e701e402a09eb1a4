/* Snappy raw-format decoder (snappy.h), written from the format description: a varint of the
 * uncompressed length, then elements whose tag byte's low two bits say literal (length in the tag
 * or in 1-4 following bytes), or a copy from `offset` bytes back with a 1-, 2- or 4-byte offset. */
#include "dataset/snappy.h"

const char *ctrl_snappy_decompress(const uint8_t *src, size_t n, uint8_t *dst, size_t cap) {
    const uint8_t *p = src, *end = src + n;
    uint64_t want = 0;
    for (int shift = 0;; shift += 7) {
        if (p >= end || shift > 28) return "snappy: bad length preamble";
        want |= (uint64_t)(*p & 0x7f) << shift;
        if (!(*p++ & 0x80)) break;
    }
    if (want != cap) return "snappy: the block's length is not the page's uncompressed size";
    size_t out = 0;
    while (p < end) {
        const uint8_t tag = *p++;
        size_t len, off;
        switch (tag & 3) {
        case 0: { /* literal */
            len = tag >> 2;
            if (len >= 60) {
                const int k = (int)len - 59; /* 1-4 length bytes */
                if (end - p < k) return "snappy: truncated literal length";
                len = 0;
                for (int i = 0; i < k; i++) len |= (size_t)p[i] << (8 * i);
                p += k;
            }
            len += 1;
            if ((size_t)(end - p) < len) return "snappy: a literal runs past the input";
            if (cap - out < len) return "snappy: output longer than declared";
            for (size_t i = 0; i < len; i++) dst[out + i] = p[i];
            p += len, out += len;
            continue;
        }
        case 1:
            if (end - p < 1) return "snappy: truncated copy";
            len = 4 + ((tag >> 2) & 7);
            off = ((size_t)(tag >> 5) << 8) | p[0];
            p += 1;
            break;
        case 2:
            if (end - p < 2) return "snappy: truncated copy";
            len = 1 + (tag >> 2);
            off = (size_t)p[0] | (size_t)p[1] << 8;
            p += 2;
            break;
        default:
            if (end - p < 4) return "snappy: truncated copy";
            len = 1 + (tag >> 2);
            off = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
            p += 4;
            break;
        }
        if (off == 0 || off > out) return "snappy: a copy reaches before the start";
        if (cap - out < len) return "snappy: output longer than declared";
        for (size_t i = 0; i < len; i++, out++) dst[out] = dst[out - off]; /* overlapping copies repeat */
    }
    return out == cap ? NULL : "snappy: output shorter than declared";
}
