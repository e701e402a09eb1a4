/* Tokenizer throughput on one thread: the corpus of tests/fixtures/tokenizer encoded line by line,
 * REPEAT times; MB/s of UTF-8 input and tokens/s. The peer: bench/tokenizer/bench_tokenizer.py.
 * usage: bench_tokenizer TOKENIZER_DIR CORPUS.jsonl [REPEAT] */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER_DIR CORPUS.jsonl [REPEAT]\n");
        return 2;
    }
    const int repeat = argc > 3 ? atoi(argv[3]) : 20;
    ctrl_tokenizer *tok;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ctrl_tokenizer_load(argv[1], &tok) != CTRL_OK) {
        fprintf(stderr, "bench: %s\n", ctrl_error_message());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double load_s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    FILE *f = fopen(argv[2], "r");
    if (!f) return 1;
    char **lines = NULL, *buf = malloc(1 << 16);
    int n = 0;
    size_t bytes = 0;
    while (fgets(buf, 1 << 16, f)) {
        cJSON *o = cJSON_Parse(buf);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (cJSON_IsString(t)) {
            lines = realloc(lines, sizeof *lines * (size_t)(n + 1));
            lines[n++] = strdup(t->valuestring);
            bytes += strlen(t->valuestring);
        }
        cJSON_Delete(o);
    }
    fclose(f);
    size_t tokens = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < repeat; r++)
        for (int i = 0; i < n; i++) {
            int32_t *ids;
            size_t k;
            ctrl_tokenizer_encode(tok, lines[i], strlen(lines[i]), 0, &ids, &k);
            tokens += k;
            free(ids);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("ctrl        load %.2f s, %.2f MB/s, %.0f tokens/s (%d lines x %d)\n", load_s,
           bytes * (double)repeat / s / 1e6, tokens / s, n, repeat);
    return 0;
}
