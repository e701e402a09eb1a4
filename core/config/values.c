/* Parsing option values and suggesting the nearest valid name. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config_internal.h"

/* strtoll/strtod would skip leading spaces; values are already trimmed, so a space is an error. */
int config_parse_int(const char *s, int64_t *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end) return -1;
    if (errno == ERANGE) return -2;
    *out = v;
    return 0;
}

int config_parse_float(const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || isnan(v)) return -1;
    if (isinf(v)) return -2; /* "inf", or beyond double's range */
    /* ERANGE on underflow (1e-400) is a tiny number read as 0 or a denormal: accept it. */
    *out = v;
    return 0;
}

int config_parse_bool(const char *s, bool *out) {
    if (!s) return -1;
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

int config_choice_ok(const char *choices, const char *word) {
    size_t n = strlen(word);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, word, n)) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* Damerau-Levenshtein (optimal string alignment) distance for short names, ignoring case: values
 * are case-sensitive, but "SFT" should still suggest 'sft'. */
static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
#define SAME(x, y) (tolower((unsigned char)(x)) == tolower((unsigned char)(y)))
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int cost = !SAME(a[i - 1], b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && SAME(a[i - 1], b[j - 2]) && SAME(a[i - 2], b[j - 1]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
#undef SAME
    return d[la][lb];
}

const char *config_suggest(const char *word, const char *const *candidates, int n) {
    const char *best = NULL;
    int best_d = 1 << 30;
    int limit = (int)strlen(word) / 3;
    if (limit < 2) limit = 2;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, candidates[i]);
        /* A candidate that contains the word or the other way round is a good guess too
         * (learning_rat -> learning_rate, batch_size -> per_device_train_batch_size). */
        if (d > limit && strlen(word) >= 4 && (strstr(candidates[i], word) || strstr(word, candidates[i])))
            d = limit;
        if (d <= limit && d < best_d) {
            best = candidates[i];
            best_d = d;
        }
    }
    return best;
}

int config_list_next(const char **pos, char *word, size_t cap) {
    const char *p = *pos;
    while (*p && (*p == ',' || isspace((unsigned char)*p))) p++;
    if (!*p) {
        *pos = p;
        return 0;
    }
    size_t n = 0;
    while (p[n] && p[n] != ',' && !isspace((unsigned char)p[n])) n++;
    *pos = p + n;
    if (n >= cap) return -1;
    memcpy(word, p, n);
    word[n] = '\0';
    return 1;
}
