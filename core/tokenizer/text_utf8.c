/* UTF-8 decoding and encoding for the tokenizer. */
#include "tokenizer/tokenizer_internal.h"

uint32_t tok_utf8_decode(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    unsigned char c = u[k];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || k + (size_t)len > n) {
        *i = k + 1;
        return 0xFFFD;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int j = 1; j < len; j++) {
        if ((u[k + j] & 0xC0) != 0x80) {
            *i = k + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (u[k + j] & 0x3F);
    }
    *i = k + (size_t)len;
    return cp;
}

size_t tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6)), o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)), o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)), o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Well-formed UTF-8 as Rust's str and PCRE2 take it: no overlongs, surrogates or code points
 * beyond U+10FFFF. */
int tok_utf8_valid(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t need = c < 0x80                 ? 0
                      : c >= 0xC2 && c <= 0xDF ? 1
                      : c >= 0xE0 && c <= 0xEF ? 2
                      : c >= 0xF0 && c <= 0xF4 ? 3
                                               : 9;
        if (need == 9 || (need && i + need >= n)) return 0;
        unsigned char lo = c == 0xE0   ? 0xA0
                           : c == 0xF0 ? 0x90
                                       : 0x80,
                      hi = c == 0xED   ? 0x9F
                           : c == 0xF4 ? 0x8F
                                       : 0xBF;
        for (size_t k = 1; k <= need; k++)
            if (s[i + k] < (k == 1 ? lo : 0x80) || s[i + k] > (k == 1 ? hi : 0xBF)) return 0;
        i += need + 1;
    }
    return 1;
}
