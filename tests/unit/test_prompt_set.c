/* Prompt datasets for the online trainers (core/train/prompt_set.c): columns beside the prompt. */
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "test_registry.h"
#include "train/online.h"

static ctrl_config *prompt_config(void) {
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[run]\noutput_dir = %s/out\n[model]\npath = %s/models/qwen2\n[data]\ntrain_file = %s/sft_data/"
             "prompt_completion.jsonl\n",
             test_tmp_dir(), CTRL_FIXTURE_DIR, CTRL_FIXTURE_DIR);
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "run.ini", ini);
    ctrl_registry_destroy(reg);
    return cfg;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A key repeated in a row (found by fuzz_prompt_rows): the last value counts, as Python's json reads
 * it, and the first one's text is freed (the sanitizer build's leak check fails the test otherwise). */
TEST(repeated_key_keeps_the_last_value) {
    char path[1024];
    snprintf(path, sizeof path, "%s/dup.jsonl", test_tmp_dir());
    write_file(path, "{\"prompt\": \"1+1=\", \"answer\": \"3\", \"answer\": \"2\"}\n"
                     "{\"extra\": true, \"prompt\": \"2+2=\", \"answer\": \"4\"}\n");
    ctrl_config *cfg = prompt_config();
    ctrl_tokenizer *tok = NULL;
    CHECK_EQ_INT(ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok), CTRL_OK);
    ctrl_prompt_set ps;
    CHECK_MSG(ctrl_prompt_set_load(path, tok, cfg, &ps) == CTRL_OK, "%s", ctrl_error_message());
    CHECK_EQ_INT(ps.n, 2);
    CHECK_EQ_INT(ps.n_cols, 2);
    CHECK_STR(ps.cols[0], "answer");
    CHECK_STR(ps.cols[1], "extra");
    CHECK_STR(ps.values[0][0], "\"2\"");
    CHECK(ps.values[0][1] == NULL); /* the first row lacks the column the second added */
    CHECK_STR(ps.values[1][0], "\"4\"");
    CHECK_STR(ps.values[1][1], "true");
    CHECK_STR(ps.text[0], "1+1=");
    ctrl_prompt_set_free(&ps);
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
}
