/* Bit-exact with the `tokenizers` library: every line of a 2200-line corpus (English, Chinese,
 * code, emoji, numbers, composed/decomposed accents, whitespace runs, newlines, special-token
 * text) encodes to the same ids, with and without special tokens, and decodes to the same text
 * (keeping and skipping special tokens), for the real Qwen3 and Llama-3 (byte-level) and Llama-2
 * (SentencePiece-style, byte fallback) tokenizers, skipped without ../shared, and for a tiny
 * trained byte-level BPE and a tiny trained SentencePiece-style BPE, never skipped. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

static char **read_corpus(int *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/corpus.jsonl", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "missing %s", path);
    if (!f) return NULL;
    char **lines = NULL, *buf = malloc(1 << 16);
    *n = 0;
    while (fgets(buf, 1 << 16, f)) {
        cJSON *o = cJSON_Parse(buf);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (cJSON_IsString(t)) {
            lines = realloc(lines, sizeof *lines * (size_t)(*n + 1));
            lines[(*n)++] = strdup(t->valuestring);
        }
        cJSON_Delete(o);
    }
    free(buf);
    fclose(f);
    return lines;
}

/* "1 2 3" -> ids */
static int parse_ids(const char *s, int32_t *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static void check_tokenizer(const char *name, const char *path) {
    ctrl_tokenizer *tok = NULL;
    ctrl_status st = ctrl_tokenizer_load(path, &tok);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (!tok) return;
    int n_lines = 0;
    char **lines = read_corpus(&n_lines);
    char ids_path[1024], dec_path[1024];
    snprintf(ids_path, sizeof ids_path, "%s/tokenizer/%s.ids", CTRL_FIXTURE_DIR, name);
    snprintf(dec_path, sizeof dec_path, "%s/tokenizer/%s.decoded.jsonl", CTRL_FIXTURE_DIR, name);
    FILE *fi = fopen(ids_path, "r"), *fd = fopen(dec_path, "r");
    CHECK(fi && fd);
    char *buf = malloc(1 << 18);
    int32_t *want = malloc(sizeof(int32_t) * 65536);
    int mismatched = 0, dec_mismatched = 0, first_bad = -1;
    for (int i = 0; i < n_lines && fi && fd; i++) {
        if (!fgets(buf, 1 << 18, fi)) break;
        char *tab = strchr(buf, '\t');
        if (!tab) break;
        *tab = '\0';
        for (int special = 0; special < 2; special++) {
            int nw = parse_ids(special ? tab + 1 : buf, want, 65536);
            int32_t *got = NULL;
            size_t ng = 0;
            CHECK_EQ_INT(ctrl_tokenizer_encode(tok, lines[i], strlen(lines[i]), special, &got, &ng), CTRL_OK);
            if ((int)ng != nw || memcmp(got, want, sizeof(int32_t) * ng) != 0) {
                if (first_bad < 0) {
                    first_bad = i;
                    printf("  %s line %d (special %d): %zu ids vs %d; text: %.80s\n", name, i, special, ng,
                           nw, lines[i]);
                    printf("    got :");
                    for (size_t k = 0; k < ng && k < 24; k++) printf(" %d", got[k]);
                    printf("\n    want:");
                    for (int k = 0; k < nw && k < 24; k++) printf(" %d", want[k]);
                    printf("\n");
                }
                mismatched++;
            }
            free(got);
        }
        /* decode, with and without special tokens (ids parsed before buf is reused) */
        int nw = parse_ids(tab + 1, want, 65536);
        if (!fgets(buf, 1 << 18, fd)) break;
        cJSON *o = cJSON_Parse(buf);
        const char *keys[2] = {"keep", "skip"};
        for (int skip = 0; skip < 2; skip++) {
            char *text = NULL;
            size_t len = 0;
            CHECK_EQ_INT(ctrl_tokenizer_decode(tok, want, (size_t)nw, skip, &text, &len), CTRL_OK);
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, keys[skip]);
            if (!cJSON_IsString(w) || strcmp(text, w->valuestring) != 0) {
                if (!dec_mismatched)
                    printf("  %s decode line %d (skip %d): '%.60s' vs '%.60s'\n", name, i, skip, text,
                           cJSON_IsString(w) ? w->valuestring : "?");
                dec_mismatched++;
            }
            free(text);
        }
        cJSON_Delete(o);
    }
    CHECK_MSG(mismatched == 0, "%s: %d encodings differ from tokenizers", name, mismatched);
    CHECK_MSG(dec_mismatched == 0, "%s: %d decodings differ from tokenizers", name, dec_mismatched);
    printf("  %-8s %d lines, encode x2 and decode x2 each: %d + %d mismatches\n", name, n_lines, mismatched,
           dec_mismatched);
    if (fi) fclose(fi);
    if (fd) fclose(fd);
    free(buf), free(want);
    for (int i = 0; i < n_lines; i++) free(lines[i]);
    free(lines);
    ctrl_tokenizer_free(tok);
}

TEST(tiny_trained_bpe) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizer/tiny_bpe", CTRL_FIXTURE_DIR);
    check_tokenizer("tiny_bpe", dir);
}

static int shared_dir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/data/tokenizers/%s", CTRL_SHARED_DIR, name);
    struct stat sb;
    return stat(out, &sb) == 0;
}

TEST(qwen3) {
    char dir[1024];
    if (!shared_dir("qwen3", dir, sizeof dir))
        TEST_SKIP("the shared tokenizer files (../shared/data/tokenizers) are absent");
    check_tokenizer("qwen3", dir);
}

TEST(tiny_sentencepiece_style_bpe) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizer/tiny_sp", CTRL_FIXTURE_DIR);
    check_tokenizer("tiny_sp", dir);
}

TEST(llama2) {
    char dir[1024];
    if (!shared_dir("llama2", dir, sizeof dir))
        TEST_SKIP("the shared tokenizer files (../shared/data/tokenizers) are absent");
    check_tokenizer("llama2", dir);
}

TEST(llama3) {
    char dir[1024];
    if (!shared_dir("llama3", dir, sizeof dir))
        TEST_SKIP("the shared tokenizer files (../shared/data/tokenizers) are absent");
    check_tokenizer("llama3", dir);
}
