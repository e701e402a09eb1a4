/* Tokenizer throughput on one thread. The peer: bench/tokenizer/bench_tokenizer.py (same modes,
 * same inputs).
 * usage: bench_tokenizer TOKENIZER_DIR CORPUS.jsonl [REPEAT]
 *          the corpus encoded line by line, REPEAT times: MB/s of UTF-8 input and tokens/s;
 *        bench_tokenizer --lines TOKENIZER_DIR CORPUS.jsonl
 *          single lines of 1 KB, 100 KB and 10 MB (the corpus's texts joined by "\n", repeated,
 *          cut at a character boundary), each encoded as one text: the best of several runs. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The corpus's "text" members (strdup'd); *bytes gets their total length. */
static char **read_corpus(const char *path, int *n, size_t *bytes) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char **lines = NULL, *buf = NULL;
    size_t cap = 0;
    *n = 0, *bytes = 0;
    while (getline(&buf, &cap, f) >= 0) {
        cJSON *o = cJSON_Parse(buf);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (cJSON_IsString(t)) {
            lines = realloc(lines, sizeof *lines * (size_t)(*n + 1));
            lines[(*n)++] = strdup(t->valuestring);
            *bytes += strlen(t->valuestring);
        }
        cJSON_Delete(o);
    }
    free(buf);
    fclose(f);
    return lines;
}

/* One line of about `size` bytes: the texts joined by "\n", repeated, cut back to the start of a
 * character (what Python's bytes[:size].decode("utf-8", "ignore") keeps). */
static char *long_line(char **lines, int n, size_t size, size_t *len) {
    char *s = malloc(size + 1);
    size_t k = 0;
    for (int i = 0; k < size; i = (i + 1) % n) {
        if (i == 0 && k && k < size) s[k++] = '\n'; /* between the last text and the first again */
        for (const char *p = lines[i]; *p && k < size; p++) s[k++] = *p;
        if (i + 1 < n && k < size) s[k++] = '\n';
    }
    if (k < size || ((unsigned char)s[k - 1] & 0x80)) { /* drop a character the cut split */
        size_t start = k - 1;
        while (start > 0 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        unsigned char c = (unsigned char)s[start];
        size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (start + need > k) k = start;
    }
    s[k] = '\0';
    *len = k;
    return s;
}

static int bench_lines(const ctrl_tokenizer *tok, char **lines, int n) {
    const size_t sizes[] = {1000, 100 * 1000, 10 * 1000 * 1000};
    const int runs[] = {200, 20, 3};
    for (int z = 0; z < 3; z++) {
        size_t len;
        char *s = long_line(lines, n, sizes[z], &len);
        double best = 1e30;
        size_t k = 0;
        for (int r = 0; r < runs[z]; r++) {
            int32_t *ids;
            const double t0 = now();
            if (ctrl_tokenizer_encode(tok, s, len, 0, &ids, &k) != CTRL_OK) {
                fprintf(stderr, "bench: %s\n", ctrl_error_message());
                return 1;
            }
            const double dt = now() - t0;
            free(ids);
            if (dt < best) best = dt;
        }
        printf("ctrl        line %9zu bytes: %8zu ids, %9.3f ms, %6.2f MB/s (best of %d)\n", len, k,
               best * 1e3, len / best / 1e6, runs[z]);
        free(s);
    }
    return 0;
}

int main(int argc, char **argv) {
    const int lines_mode = argc > 1 && !strcmp(argv[1], "--lines");
    if (argc < 3 + lines_mode) {
        fprintf(stderr, "usage: bench_tokenizer [--lines] TOKENIZER_DIR CORPUS.jsonl [REPEAT]\n");
        return 2;
    }
    argv += lines_mode;
    const int repeat = argc > 3 + lines_mode ? atoi(argv[3]) : 20;
    ctrl_tokenizer *tok;
    double t0 = now();
    if (ctrl_tokenizer_load(argv[1], &tok) != CTRL_OK) {
        fprintf(stderr, "bench: %s\n", ctrl_error_message());
        return 1;
    }
    const double load_s = now() - t0;
    int n;
    size_t bytes;
    char **lines = read_corpus(argv[2], &n, &bytes);
    if (!lines || !n) return 1;
    if (lines_mode) return bench_lines(tok, lines, n);
    size_t tokens = 0;
    t0 = now();
    for (int r = 0; r < repeat; r++)
        for (int i = 0; i < n; i++) {
            int32_t *ids;
            size_t k;
            ctrl_tokenizer_encode(tok, lines[i], strlen(lines[i]), 0, &ids, &k);
            tokens += k;
            free(ids);
        }
    const double s = now() - t0;
    printf("ctrl        load %.2f s, %.2f MB/s, %.0f tokens/s (%d lines x %d)\n", load_s,
           bytes * (double)repeat / s / 1e6, tokens / s, n, repeat);
    return 0;
}
