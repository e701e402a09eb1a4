/* Tokenizer files are untrusted: each malformed or unsupported tokenizer.json gives one clear
 * error naming the file, never a crash. And the small API around encode/decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tok_files.h"
#include "tokenizer/tokenizer.h"

#define BYTE_LEVEL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"

TEST(malformed_and_unsupported_files) {
    tok_expect_load_error("truncated.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0",
                          CTRL_ERR_FORMAT, "not a JSON object");
    tok_expect_load_error("no_model.json", "{\"added_tokens\": []}", CTRL_ERR_FORMAT, "no model");
    tok_expect_load_error("wordpiece.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
                          CTRL_ERR_UNSUPPORTED, "'WordPiece' is not supported");
    tok_expect_load_error("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
                          CTRL_ERR_UNSUPPORTED, "'Unigram'");
    tok_expect_load_error("bad_vocab.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": [1, 2], \"merges\": []}}",
                          CTRL_ERR_FORMAT, "vocab is not an object");
    tok_expect_load_error("bad_id.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
                          CTRL_ERR_FORMAT, "'a' has no valid id");
    tok_expect_load_error("bad_merge.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}",
                          CTRL_ERR_FORMAT, "is not 'a b'");
    tok_expect_load_error(
        "merge_unknown.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
        CTRL_ERR_FORMAT, "missing from the vocabulary");
    tok_expect_load_error(
        "bad_regex.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": "
        "{\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
        CTRL_ERR_FORMAT, "regex");
    tok_expect_load_error(
        "normalizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": "
        "\"NFKD\"}, " BYTE_LEVEL "}",
        CTRL_ERR_UNSUPPORTED, "'NFKD'");
    tok_expect_load_error("no_byte_level.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
                          CTRL_ERR_UNSUPPORTED, "byte-level");
    tok_expect_load_error("bad_added.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": "
                          "[{\"id\": 3}], " BYTE_LEVEL "}",
                          CTRL_ERR_FORMAT, "added token");
    tok_expect_load_error("three_part_merge.json",
                          "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}}",
                          CTRL_ERR_FORMAT, "is not 'a b'");
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load("/nonexistent/tokenizer.json", &t), CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), "/nonexistent/tokenizer.json");
}

/* A SentencePiece-style model (byte fallback) with one part replaced. */
#define SP_MODEL                                                                                             \
    "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": "         \
    "{\"<unk>\": 0, "                                                                                        \
    "\"a\": 1, \"b\": 2, \"ab\": 3}, \"merges\": [\"#version: 0.2\", \"a b\"]}, "
#define SP_NORMALIZER                                                                                        \
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "       \
    "\"\u2581\"}]}"

TEST(sentencepiece_style_errors) {
    tok_expect_load_error(
        "regex_replace.json",
        SP_MODEL
        "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"x\"}}",
        CTRL_ERR_UNSUPPORTED, "normalizer Replace: only a literal String pattern");
    tok_expect_load_error("nfkc.json", SP_MODEL "\"normalizer\": {\"type\": \"NFKC\"}}", CTRL_ERR_UNSUPPORTED,
                          "'NFKC'");
    tok_expect_load_error("wordpiece_decoder.json",
                          SP_MODEL SP_NORMALIZER ", \"decoder\": {\"type\": \"WordPiece\"}}",
                          CTRL_ERR_UNSUPPORTED, "decoder 'WordPiece' is not supported");
    tok_expect_load_error("regex_decoder.json",
                          SP_MODEL SP_NORMALIZER
                          ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": "
                          "\"Replace\", \"pattern\": {\"Regex\": \"x\"}, \"content\": \" \"}]}}",
                          CTRL_ERR_UNSUPPORTED, "decoder Replace");
    tok_expect_load_error(
        "bad_strip.json",
        SP_MODEL SP_NORMALIZER
        ", \"decoder\": {\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}}",
        CTRL_ERR_FORMAT, "Strip");
    tok_expect_load_error("bad_scheme.json",
                          SP_MODEL "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", "
                                   "\"prepend_scheme\": \"sometimes\"}}",
                          CTRL_ERR_FORMAT, "prepend_scheme 'sometimes'");
    tok_expect_load_error("contradiction.json",
                          SP_MODEL "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", "
                                   "\"add_prefix_space\": false, \"prepend_scheme\": \"always\"}}",
                          CTRL_ERR_FORMAT, "add_prefix_space");
    tok_expect_load_error("long_replacement.json",
                          SP_MODEL "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"__\"}}",
                          CTRL_ERR_FORMAT, "one-character replacement");
    tok_expect_load_error("split_without_byte_level.json",
                          SP_MODEL
                          "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                          "\"behavior\": \"Isolated\", \"invert\": false}}",
                          CTRL_ERR_UNSUPPORTED, "Split pre-tokenizer without ByteLevel");
    tok_expect_load_error("byte_level_metaspace.json",
                          SP_MODEL BYTE_LEVEL
                          ", \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"_\"}}",
                          CTRL_ERR_UNSUPPORTED, "ByteLevel");
    /* unk_token naming no vocabulary entry: an error when a character needs it (as the library's
     * UnkTokenOutOfVocabulary), none before */
    const char *path = tok_write_file("unk_missing.json",
                                      "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": "
                                      "{\"a\": 0}, \"merges\": []}, " SP_NORMALIZER "}");
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(path, &t), CTRL_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, "aza", 3, 0, &ids, &n), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "unk_missing.json");
    CHECK_CONTAINS(ctrl_error_message(), "unk_token");
    ctrl_tokenizer_free(t);
}

TEST(api_on_the_tiny_tokenizer) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/tiny_bpe", CTRL_FIXTURE_DIR);
    ctrl_tokenizer *t = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(path, &t), CTRL_OK);
    if (!t) return;
    CHECK_EQ_INT(ctrl_tokenizer_token_to_id(t, "<|im_end|>"), ctrl_tokenizer_eos_id(t));
    CHECK_EQ_INT(ctrl_tokenizer_token_to_id(t, "<|endoftext|>"), ctrl_tokenizer_pad_id(t));
    CHECK_STR(ctrl_tokenizer_id_to_token(t, ctrl_tokenizer_eos_id(t)), "<|im_end|>");
    CHECK(ctrl_tokenizer_id_to_token(t, -1) == NULL && ctrl_tokenizer_id_to_token(t, 1 << 20) == NULL);
    CHECK(ctrl_tokenizer_chat_template(t) && strstr(ctrl_tokenizer_chat_template(t), "<|im_start|>"));
    CHECK(ctrl_tokenizer_vocab_size(t) >= 1024);
    /* empty text; out-of-range ids decode to nothing */
    int32_t *ids = NULL;
    size_t n = 99;
    CHECK_EQ_INT(ctrl_tokenizer_encode(t, "", 0, 1, &ids, &n), CTRL_OK);
    CHECK_EQ_INT(n, 0);
    free(ids);
    int32_t bad[3] = {-5, 1 << 20, ctrl_tokenizer_eos_id(t)};
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(ctrl_tokenizer_decode(t, bad, 3, 0, &text, &len), CTRL_OK);
    CHECK_STR(text, "<|im_end|>");
    free(text);
    ctrl_tokenizer_free(t);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_tmp_dir());
    CHECK(system(cmd) == 0);
}
