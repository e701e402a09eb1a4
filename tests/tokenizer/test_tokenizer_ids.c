/* Ids in tokenizer.json and tokenizer_config.json are untrusted: each one is checked where it is
 * read and a bad one is refused naming the file, the field and the value — never written to or
 * read from a table out of bounds. Expected ids of the accepted files were computed with the
 * `tokenizers` library (0.23) on the same JSON. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tok_files.h"
#include "tokenizer/tokenizer.h"

/* vocab {a, b, ab} with the merge "a b" and a byte-level pre-tokenizer; ADDED is the added_tokens list */
#define MODEL(VOCAB)                                                                                         \
    "{\"model\": {\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [\"a b\"]}, \"pre_tokenizer\": "      \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"
#define VOCAB "{\"a\": 0, \"b\": 1, \"ab\": 2}"
#define ADDED(ID, CONTENT) "{\"id\": " ID ", \"content\": \"" CONTENT "\", \"special\": true}"

TEST(added_token_ids_out_of_range_are_refused) {
    /* was a heap write at id_to_token[-1] */
    tok_expect_load_error("added_negative.json", MODEL(VOCAB) ", \"added_tokens\": [" ADDED("-1", "X") "]}",
                          CTRL_ERR_FORMAT,
                          "added_tokens[0]: 'X' has id -1, but the tokenizers library gives it id 3");
    /* id + 1 overflowed int32: n_ids stayed small and the write went far out of bounds */
    tok_expect_load_error("added_int_max.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("2147483647", "X") "]}", CTRL_ERR_FORMAT,
                          "has id 2147483647");
    tok_expect_load_error("added_u32.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("4294967295", "X") "]}", CTRL_ERR_FORMAT,
                          "has id 4294967295");
    /* a large id made a table of that many entries */
    tok_expect_load_error("added_large.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("50000000", "X") "]}", CTRL_ERR_FORMAT,
                          "has id 50000000");
    tok_expect_load_error("added_fraction.json", MODEL(VOCAB) ", \"added_tokens\": [" ADDED("3.5", "X") "]}",
                          CTRL_ERR_FORMAT, "has id 3.5");
}

TEST(added_token_ids_that_disagree_are_refused) {
    /* two tokens on one id: the second one took the first one's slot */
    tok_expect_load_error("added_duplicate_id.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("3", "X") ", " ADDED("3", "Y") "]}",
                          CTRL_ERR_FORMAT,
                          "added_tokens[1]: 'Y' has id 3, but the tokenizers library gives it id 4");
    /* an added token on a vocabulary entry's id overwrote that entry */
    tok_expect_load_error("added_on_vocab_id.json", MODEL(VOCAB) ", \"added_tokens\": [" ADDED("1", "X") "]}",
                          CTRL_ERR_FORMAT, "'X' has id 1, but the tokenizers library gives it id 3");
    /* a vocabulary token listed again under another id */
    tok_expect_load_error("added_vocab_mismatch.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("5", "ab") "]}", CTRL_ERR_FORMAT,
                          "gives it id 2 (its id in model.vocab)");
    tok_expect_load_error("added_twice.json",
                          MODEL(VOCAB) ", \"added_tokens\": [" ADDED("3", "X") ", " ADDED("3", "X") "]}",
                          CTRL_ERR_FORMAT, "'X' is listed twice");
    tok_expect_load_error("added_not_list.json", MODEL(VOCAB) ", \"added_tokens\": {\"X\": 3}}",
                          CTRL_ERR_FORMAT, "added_tokens is not an array");
    /* the next free id after a sparse vocabulary is taken by a vocabulary entry */
    tok_expect_load_error(
        "added_collides.json",
        MODEL("{\"a\": 0, \"b\": 3, \"ab\": 2}") ", \"added_tokens\": [" ADDED("3", "X") "]}",
        CTRL_ERR_FORMAT, "id 3 of 'X' is already 'b'");
}

TEST(vocab_ids_are_checked) {
    /* a large id made a table of that many entries (800 MB for 1e8) */
    tok_expect_load_error(
        "vocab_large.json", MODEL("{\"a\": 0, \"b\": 99999999, \"ab\": 2}") "}", CTRL_ERR_FORMAT,
        "model.vocab: 'b' has no valid id (99999999; an id is an integer in [0, 16777216))");
    tok_expect_load_error("vocab_fraction.json", MODEL("{\"a\": 0, \"b\": 1.25, \"ab\": 2}") "}",
                          CTRL_ERR_FORMAT, "'b' has no valid id (1.25;");
    tok_expect_load_error("vocab_negative.json", MODEL("{\"a\": 0, \"b\": -1, \"ab\": 2}") "}",
                          CTRL_ERR_FORMAT, "'b' has no valid id (-1;");
    /* two tokens on one id: decoding it depended on the hash table's order */
    tok_expect_load_error("vocab_duplicate_id.json", MODEL("{\"a\": 0, \"b\": 0, \"ab\": 2}") "}",
                          CTRL_ERR_FORMAT, "both have id 0");
}

#define TEMPLATE(IDS)                                                                                        \
    ", \"added_tokens\": [" ADDED(                                                                           \
        "3", "<s>") "], \"post_processor\": {\"type\": \"TemplateProcessing\", "                             \
                    "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": "    \
                    "{\"id\": \"A\", "                                                                       \
                    "\"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": " IDS       \
                    ", \"tokens\": [\"<s>\"]}}}}"

TEST(post_processor_ids_are_checked) {
    /* the library emits special_tokens[..].ids: an id beyond the vocabulary reached the model */
    tok_expect_load_error("template_large.json", MODEL(VOCAB) TEMPLATE("[1000]"), CTRL_ERR_FORMAT,
                          "special_tokens['<s>'].ids = [1000] names no token");
    tok_expect_load_error("template_negative.json", MODEL(VOCAB) TEMPLATE("[-2]"), CTRL_ERR_FORMAT,
                          "ids = [-2]");
    tok_expect_load_error("template_two.json", MODEL(VOCAB) TEMPLATE("[3, 3]"), CTRL_ERR_UNSUPPORTED,
                          "has 2 ids");
    tok_expect_load_error("template_missing.json",
                          MODEL(VOCAB) ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                                       "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}]}}",
                          CTRL_ERR_FORMAT, "'<s>' has no special_tokens entry");
    /* the id the library emits is special_tokens' one (here the vocabulary's "b"), as `tokenizers` */
    const char *path = tok_write_file("template_ok.json", MODEL(VOCAB) TEMPLATE("[1]"));
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(path, &t), CTRL_OK);
    if (!t) return;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, "ab<s>", 5, 1, &ids, &n), CTRL_OK);
    CHECK_EQ_INT(n, 3);
    if (n == 3) CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 3);
    free(ids);
    ctrl_tokenizer_free(t);
}

/* A directory with the tokenizer.json above plus tokenizer_config.json `config`. */
static const char *write_dir(const char *name, const char *config) {
    static char dir[512];
    char cmd[700], file[300];
    snprintf(dir, sizeof dir, "%s/%s", test_tmp_dir(), name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0);
    snprintf(file, sizeof file, "%s/tokenizer.json", name);
    tok_write_file(file, MODEL(VOCAB) ", \"added_tokens\": [" ADDED("3", "X") "]}");
    snprintf(file, sizeof file, "%s/tokenizer_config.json", name);
    tok_write_file(file, config);
    return dir;
}

static void expect_config_error(const char *name, const char *config, const char *needle) {
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(write_dir(name, config), &t), CTRL_ERR_FORMAT);
    CHECK(t == NULL);
    CHECK_CONTAINS(ctrl_error_message(), "tokenizer_config.json");
    CHECK_CONTAINS(ctrl_error_message(), needle);
    ctrl_tokenizer_free(t);
}

TEST(tokenizer_config_fields_are_checked) {
    /* a token the vocabulary lacks was id -1: generation never saw its EOS */
    expect_config_error("cfg_unknown_eos", "{\"eos_token\": \"<|nope|>\"}",
                        "eos_token '<|nope|>' is not a token");
    expect_config_error("cfg_number_pad", "{\"pad_token\": 7}", "pad_token is neither a string");
    expect_config_error("cfg_object_bos", "{\"bos_token\": {\"content\": 3}}", "bos_token is neither");
    expect_config_error("cfg_template", "{\"chat_template\": 5}", "chat_template is neither");
    /* accepted: null, the object form, an added token */
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(write_dir("cfg_ok", "{\"bos_token\": null, \"eos_token\": {\"content\": "
                                                         "\"X\"}, \"pad_token\": \"ab\"}"),
                                     &t),
                 CTRL_OK);
    if (!t) return;
    CHECK_EQ_INT(ctrl_tokenizer_bos_id(t), -1);
    CHECK_EQ_INT(ctrl_tokenizer_eos_id(t), 3);
    CHECK_EQ_INT(ctrl_tokenizer_pad_id(t), 2);
    ctrl_tokenizer_free(t);
}

TEST(valid_ids_encode_and_decode_as_the_library) {
    const char *path = tok_write_file("ok.json", MODEL(VOCAB) ", \"added_tokens\": [" ADDED("3", "X") "]}");
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(path, &t), CTRL_OK);
    if (!t) return;
    CHECK_EQ_INT(ctrl_tokenizer_vocab_size(t), 4);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, "abX", 3, 0, &ids, &n), CTRL_OK); /* tokenizers: [2, 3] */
    CHECK_EQ_INT(n, 2);
    if (n == 2) CHECK(ids[0] == 2 && ids[1] == 3);
    free(ids);
    /* ids outside the table decode to nothing */
    const int32_t odd[] = {-1, 4, 3, 1 << 30, INT32_MAX, 0};
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(ctrl_tokenizer_decode(t, odd, 6, 0, &text, &len), CTRL_OK);
    CHECK_STR(text, "Xa");
    free(text);
    CHECK(ctrl_tokenizer_id_to_token(t, 4) == NULL && ctrl_tokenizer_id_to_token(t, -7) == NULL);
    ctrl_tokenizer_free(t);
    /* nothing to decode through a decoder chain (Fuse then Strip made a token in a list without a
     * buffer: UBSan's "zero offset to null pointer", found by fuzz_tokenize_text) */
    char sp_dir[1024];
    snprintf(sp_dir, sizeof sp_dir, "%s/tokenizer/tiny_sp", CTRL_FIXTURE_DIR);
    CHECK_EQ_INT(ctrl_tokenizer_load(sp_dir, &t), CTRL_OK);
    const int32_t bos[] = {ctrl_tokenizer_bos_id(t)};
    for (int k = 0; t && k < 2; k++) {
        CHECK_EQ_INT(ctrl_tokenizer_decode(t, bos, (size_t)k, 1, &text, &len),
                     CTRL_OK); /* [], [<s>] skipped */
        CHECK_EQ_INT(len, 0);
        free(text);
    }
    ctrl_tokenizer_free(t);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_tmp_dir());
    CHECK(system(cmd) == 0);
}
