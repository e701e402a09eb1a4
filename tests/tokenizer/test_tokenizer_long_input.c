/* Long lines: interruptible, and encoding takes time linear in the input (it was quadratic: PCRE2 re-checked
 * the UTF-8 validity of the whole remaining line at every match, 15 s for 600 KB). Timed in the thread's CPU
 * time, best of a few runs, against a bound 3x above linear and far below quadratic (a 20x longer input:
 * linear ~20x, quadratic ~400x), so a loaded machine does not make it flaky. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "interrupt.h"
#include "test.h"
#include "tokenizer/tok_files.h"
#include "tokenizer/tokenizer.h"

/* A tokenizer of tests/fixtures/tokenizer (NULL, and a failed check, if it does not load). */
static ctrl_tokenizer *fixture(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/%s", CTRL_FIXTURE_DIR, name);
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(path, &t), CTRL_OK);
    return t;
}

/* `unit` repeated to n bytes (malloc'd). */
static char *repeat(const char *unit, size_t n) {
    const size_t ul = strlen(unit);
    char *s = malloc(n + 1);
    for (size_t i = 0; s && i < n; i++) s[i] = unit[i % ul];
    if (s) s[n] = '\0';
    return s;
}

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best CPU time of `runs` encodes of s; *n_ids gets the id count. */
static double encode_seconds(const ctrl_tokenizer *t, const char *s, size_t n, int runs, size_t *n_ids) {
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        int32_t *ids = NULL;
        const double t0 = thread_seconds();
        CHECK_EQ_INT(ctrl_tokenizer_encode(t, s, n, 0, &ids, n_ids), CTRL_OK);
        const double dt = thread_seconds() - t0;
        free(ids);
        if (dt < best) best = dt;
    }
    return best;
}

TEST(encoding_time_is_linear_in_the_line_length) {
    ctrl_tokenizer *bpe = fixture("tiny_bpe"), *sp = fixture("tiny_sp");
    if (!bpe || !sp) return;
    /* byte-level: "ab " is one pre-token a word; the mixed unit exercises every branch of the
     * GPT-2 pattern. SentencePiece-style (no pre-tokenizer): a whole line is one BPE word, merged
     * in runs between characters no merge joins. */
    const char *units[] = {"ab ", "Hi, it's 42 caf\xc3\xa9s!\n\n  \t x", "ab ",
                           "Hi, it's 42 caf\xc3\xa9s!\n\n  \t x"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        const ctrl_tokenizer *t = u < 2 ? bpe : sp;
        const size_t small = 10 * 1000, big = 200 * 1000;
        char *a = repeat(units[u], small), *b = repeat(units[u], big);
        size_t na = 0, nb = 0;
        encode_seconds(t, a, small, 1, &na); /* warm the caches */
        const double ta = encode_seconds(t, a, small, 5, &na), tb = encode_seconds(t, b, big, 3, &nb);
        printf("  unit %zu: %zu bytes %.2f ms, %zu bytes %.2f ms: x%.1f (linear: x20)\n", u, small, ta * 1e3,
               big, tb * 1e3, tb / ta);
        CHECK_MSG(tb < 60 * ta + 0.005, "200 KB took %.1f ms, 10 KB %.2f ms: x%.0f is not linear", tb * 1e3,
                  ta * 1e3, tb / ta);
        CHECK(nb > 19 * na && nb < 21 * na); /* the same kind of text, 20x the tokens */
        free(a), free(b);
    }
    ctrl_tokenizer_free(bpe);
    ctrl_tokenizer_free(sp);
}

/* Interruption (core/interrupt.h): a long encode polls the source every few thousand pre-tokens
 * (and every 65536 merges of one long pre-token) and stops with CTRL_ERR_INTERRUPTED. */
static int polls;
static double interrupt_at; /* the source says "interrupted" from this monotonic time on */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int source(void) {
    polls++;
    return now() >= interrupt_at;
}

static ctrl_status encode_polled(const ctrl_tokenizer *t, const char *s, size_t n) {
    int32_t *ids = NULL;
    size_t k = 0;
    polls = 0;
    ctrl_status st = ctrl_tokenizer_encode(t, s, n, 0, &ids, &k);
    free(ids);
    return st;
}

TEST(a_long_encode_stops_when_interrupted) {
    ctrl_tokenizer *t = fixture("tiny_bpe"), *sp = fixture("tiny_sp");
    if (!t || !sp) return;
    const size_t n = 4 << 20;
    char *words = repeat("ab ", n), *one_word = repeat("ab", n); /* 1.4M pre-tokens; one pre-token */
    ctrl_interrupt_set_source(source);
    interrupt_at = 0; /* already interrupted: each stops at its first poll */
    CHECK_EQ_INT(encode_polled(t, words, n), CTRL_ERR_INTERRUPTED);
    CHECK_CONTAINS(ctrl_error_message(), "interrupted");
    CHECK_EQ_INT(polls, 1);
    CHECK_EQ_INT(encode_polled(t, one_word, n), CTRL_ERR_INTERRUPTED); /* in the BPE merges */
    CHECK_EQ_INT(polls, 1);
    CHECK_EQ_INT(encode_polled(sp, words, n), CTRL_ERR_INTERRUPTED); /* SentencePiece-style */
    CHECK_EQ_INT(polls, 1);
    /* a short text finishes: fewer pre-tokens than one poll interval */
    CHECK_EQ_INT(encode_polled(t, words, 3000), CTRL_OK);
    CHECK_EQ_INT(polls, 0);
    /* interrupted 20 ms into the encode: it returns well within a second */
    const double t0 = now();
    interrupt_at = t0 + 0.02;
    CHECK_EQ_INT(encode_polled(t, words, n), CTRL_ERR_INTERRUPTED);
    const double took = now() - t0;
    CHECK_MSG(took < 1.0, "the interrupted encode took %.2f s", took);
    /* without a source nothing is interrupted */
    ctrl_interrupt_set_source(NULL);
    CHECK_EQ_INT(encode_polled(t, words, 1 << 20), CTRL_OK);
    free(words), free(one_word);
    ctrl_tokenizer_free(t);
    ctrl_tokenizer_free(sp);
}

/* Loads a tokenizer.json written into the scratch directory (NULL, and a failed check, if it
 * does not load). */
static ctrl_tokenizer *load_written(const char *name, const char *json) {
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(tok_write_file(name, json), &t), CTRL_OK);
    return t;
}

/* A Split regex from the file that backtracks exponentially hits PCRE2's match limit: an error
 * naming the file, not a hang and not a silently different split (it was one piece). */
TEST(a_runaway_regex_is_an_error) {
    ctrl_tokenizer *t = load_written(
        "runaway.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"(a|aa)+\\\\d\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}");
    if (!t) return;
    char *s = repeat("a", 200);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, s, 200, 0, &ids, &n), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "runaway.json: the pre-tokenizer regex failed at byte 0");
    CHECK_CONTAINS(ctrl_error_message(), "limit");
    free(s);
    ctrl_tokenizer_free(t);
}

/* A long word is merged in runs cut between characters no merge joins; a merge of byte tokens
 * (here <0xC3> <0xA9>, the bytes of an 'é' outside the vocabulary) joins symbols that are not
 * characters, so such a tokenizer is never cut. Expected ids: tokenizers 0.23.3 on this file. */
TEST(a_long_word_is_cut_only_where_no_merge_joins) {
    ctrl_tokenizer *t =
        load_written("byte_merge.json", "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                                        "\"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
                                        "\"<0xC3>\": 1, \"<0xA9>\": 2, \"a\": 3, \"<0xC3><0xA9>\": 4, \"<\": "
                                        "5, \">\": 6, \"b\": 7, \"ab\": 8}, "
                                        "\"merges\": [\"<0xC3> <0xA9>\", \"a b\"]}, \"normalizer\": "
                                        "{\"type\": \"Sequence\", \"normalizers\": "
                                        "[{\"type\": \"Prepend\", \"prepend\": \"a\"}]}}");
    if (!t) return;
    char text[400];
    memset(text, 'b', 300);
    memcpy(text + 300, "\xc3\xa9", 3);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, text, 302, 0, &ids, &n), CTRL_OK); /* "a" + 300 "b" + "é" */
    CHECK_EQ_INT(n, 301);
    if (n == 301) {
        int bs = 0;
        for (int i = 1; i < 300; i++) bs += ids[i] == 7;
        CHECK(ids[0] == 8 && bs == 299 && ids[300] == 4);
    }
    free(ids);
    ctrl_tokenizer_free(t);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_tmp_dir());
    CHECK(system(cmd) == 0);
}
