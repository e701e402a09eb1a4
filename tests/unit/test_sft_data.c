/* SFT data preparation against TRL's own (fixtures from tests/reference/make_sft_data_fixtures.py):
 * for text, prompt-completion (string and conversational), messages, ShareGPT conversations,
 * assistant-only loss through a {% generation %} template and both truncation modes, the ids and
 * trained-token masks ctrl builds equal TRL's input_ids and labels != -100, row for row, with the
 * same rows dropped. Also: a JSON array file reads like the JSONL file, and malformed rows are
 * errors naming file:line (or are skipped and counted). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config_load.h"
#include "file_text.h"
#include "test.h"
#include "test_registry.h"
#include "train/train.h"

#define SFT_DIR CTRL_FIXTURE_DIR "/sft_data"

/* A config with [data] train_file = path and the given [data] lines. */
static ctrl_config *config_for(const char *train_file, const char *data_lines) {
    char ini[4096];
    snprintf(ini, sizeof ini,
             "[run]\noutput_dir = %s/out\n[model]\npath = %s/models/qwen2\n[data]\ntrain_file = %s\n%s\n",
             test_tmp_dir(), CTRL_FIXTURE_DIR, train_file, data_lines);
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "run.ini", ini);
    ctrl_registry_destroy(reg);
    return cfg;
}

/* [data] lines from the case's options.json ({"max_length": 23, ...}). */
static void options_to_ini(const char *name, char *out, size_t cap) {
    char path[1024];
    snprintf(path, sizeof path, SFT_DIR "/%s.options.json", name);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 16, &st);
    cJSON *o = text ? cJSON_Parse(text) : NULL, *k;
    size_t n = 0;
    out[0] = 0;
    cJSON_ArrayForEach(k, o) {
        if (cJSON_IsString(k) && !strcmp(k->string, "chat_template_path"))
            n += (size_t)snprintf(out + n, cap - n, "%s = %s/%s\n", k->string, CTRL_FIXTURE_DIR,
                                  k->valuestring);
        else if (cJSON_IsString(k))
            n += (size_t)snprintf(out + n, cap - n, "%s = %s\n", k->string, k->valuestring);
        else if (cJSON_IsBool(k))
            n += (size_t)snprintf(out + n, cap - n, "%s = %s\n", k->string,
                                  cJSON_IsTrue(k) ? "true" : "false");
        else
            n += (size_t)snprintf(out + n, cap - n, "%s = %d\n", k->string, k->valueint);
    }
    cJSON_Delete(o);
    free(text);
}

static int compare_with_trl(const char *name, const char *train_file) {
    char data[2048], path[1024];
    options_to_ini(name, data, sizeof data);
    ctrl_config *cfg = config_for(train_file, data);
    ctrl_tokenizer *tok;
    CHECK_EQ_INT(ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok), CTRL_OK);
    ctrl_dataset d;
    ctrl_status st = ctrl_dataset_load_sft(train_file, tok, cfg, &d);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    snprintf(path, sizeof path, SFT_DIR "/%s.expected.jsonl", name);
    char *text = ctrl_read_text_file(path, 1 << 22, &st);
    int rows = 0, same = 1;
    for (char *line = strtok(text, "\n"); line && st == CTRL_OK; line = strtok(NULL, "\n"), rows++) {
        cJSON *r = cJSON_Parse(line);
        const cJSON *ids = cJSON_GetObjectItem(r, "input_ids"), *tr = cJSON_GetObjectItem(r, "trained");
        if (rows >= d.n || d.ex[rows].len != cJSON_GetArraySize(ids)) {
            CHECK_MSG(0, "%s row %d: length %d, TRL %d", name, rows, rows < d.n ? d.ex[rows].len : -1,
                      cJSON_GetArraySize(ids));
            same = 0;
        } else {
            for (int i = 0; i < d.ex[rows].len; i++) {
                same &= d.ex[rows].ids[i] == cJSON_GetArrayItem(ids, i)->valueint;
                same &= d.ex[rows].trained[i] == cJSON_GetArrayItem(tr, i)->valueint;
            }
            CHECK_MSG(same, "%s row %d: ids or trained mask differ from TRL", name, rows);
        }
        cJSON_Delete(r);
    }
    if (st == CTRL_OK) {
        CHECK_MSG(d.n == rows, "%s: %d examples, TRL keeps %d", name, d.n, rows);
        ctrl_dataset_free(&d);
    }
    free(text);
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
    return rows;
}

#define TRL_CASE(name)                                                                                       \
    TEST(name##_matches_trl) { CHECK(compare_with_trl(#name, SFT_DIR "/" #name ".jsonl") > 0); }

TRL_CASE(text)
TRL_CASE(prompt_completion)
TRL_CASE(prompt_completion_full_loss)
TRL_CASE(messages)
TRL_CASE(messages_assistant_only)
TRL_CASE(conversational_prompt_completion)
TRL_CASE(sharegpt)
TRL_CASE(truncated_keep_start)
TRL_CASE(truncated_keep_end)

TEST(json_array_file_reads_like_jsonl) {
    CHECK_EQ_INT(compare_with_trl("messages", SFT_DIR "/messages_array.json"), 6);
}

static ctrl_status load_text(const char *rows, const char *data_lines, ctrl_dataset *d) {
    const char *tmpdir = test_tmp_dir();
    if (!tmpdir) return CTRL_ERR_IO;
    char path[1024];
    snprintf(path, sizeof path, "%s/rows.jsonl", tmpdir);
    FILE *f = fopen(path, "w");
    fputs(rows, f);
    fclose(f);
    ctrl_config *cfg = config_for(path, data_lines);
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    ctrl_status st = ctrl_dataset_load_sft(path, tok, cfg, d);
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
    return st;
}

TEST(malformed_rows_name_file_and_line) {
    static const struct {
        const char *row, *why;
    } bad[] = {
        {"not json", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"prompt\": \"a\", \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         "both be strings"},
        {"{\"messages\": []}", "non-empty list"},
        {"{\"messages\": [{\"content\": \"no role\"}]}", "\"role\""},
        {"{\"other\": 1}", "expected \"text\""},
        {"{\"input_ids\": [1, -5]}", "token ids"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char rows[512];
        snprintf(rows, sizeof rows, "{\"text\": \"fine row\"}\n\n%s\n", bad[i].row);
        ctrl_dataset d;
        CHECK_EQ_INT(load_text(rows, "", &d), CTRL_ERR_FORMAT);
        CHECK_CONTAINS(ctrl_error_message(), "rows.jsonl:3");
        CHECK_CONTAINS(ctrl_error_message(), bad[i].why);
    }
    ctrl_dataset d;
    CHECK_EQ_INT(load_text("{\"text\": \"ok\"}\nnot json\n{\"x\": 1}\n{\"text\": \"ok too\"}\n",
                           "skip_bad_rows = true", &d),
                 CTRL_OK);
    CHECK_EQ_INT(d.n, 2);
    CHECK_EQ_INT(d.skipped_bad, 2);
    ctrl_dataset_free(&d);
}

TEST(assistant_only_without_generation_blocks_is_an_error) {
    ctrl_dataset d;
    const char *row = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                      "\"content\": \"yo\"}]}\n";
    CHECK_EQ_INT(load_text(row, "assistant_only_loss = true", &d), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "rows.jsonl:1");
    CHECK_CONTAINS(ctrl_error_message(), "generation");
}

TEST(unclosed_json_array_is_an_error) {
    const char *tmpdir = test_tmp_dir();
    if (!tmpdir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/rows.json", tmpdir);
    FILE *f = fopen(path, "w");
    fputs("[\n {\"text\": \"a\"},\n {\"text\": \"b\"\n", f);
    fclose(f);
    ctrl_config *cfg = config_for(path, "");
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    ctrl_dataset d;
    CHECK_EQ_INT(ctrl_dataset_load_sft(path, tok, cfg, &d), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "rows.json:3");
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
}

/* eval_fraction holds out a seeded share of the training rows; the split is the same for the same
 * seed, and every example lands in exactly one of the two sets. */
TEST(eval_fraction_holds_out_rows) {
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    int first_ids[2][64], n_eval[2] = {0};
    for (int run = 0; run < 2; run++) {
        ctrl_config *cfg = config_for(SFT_DIR "/prompt_completion.jsonl", "eval_fraction = 0.34");
        ctrl_dataset train, eval;
        CHECK_EQ_INT(ctrl_datasets_load(cfg, tok, &train, &eval), CTRL_OK);
        CHECK_EQ_INT(train.n + eval.n, 6);
        CHECK_EQ_INT(eval.n, 2); /* round(6 * 0.34) */
        n_eval[run] = eval.n;
        for (int i = 0; i < eval.n; i++) first_ids[run][i] = eval.ex[i].len * 1000 + eval.ex[i].ids[1];
        ctrl_dataset_free(&train), ctrl_dataset_free(&eval);
        ctrl_config_free(cfg);
    }
    CHECK_EQ_INT(n_eval[0], n_eval[1]);
    for (int i = 0; i < n_eval[0]; i++) CHECK_EQ_INT(first_ids[0][i], first_ids[1][i]);
    ctrl_tokenizer_free(tok);
}

/* The hold-out SFT and the preference trainers share: rows of any size, the seed's picks (rows 0, 3, 4 of
 * 10 at 0.3 and seed 42, the xorshift shuffle worked by hand) moved in order, the rest closed up in
 * order; no row left to train is refused with the rows untouched. */
TEST(hold_out_split_moves_the_seeded_rows_in_order) {
    typedef struct {
        int id;
        char pad[9];
    } row;
    row rows[10];
    for (int i = 0; i < 10; i++) memset(&rows[i], 'a' + i, sizeof rows[i]), rows[i].id = i;
    int n = 10, n_held = -1;
    void *held = NULL;
    CHECK_EQ_INT(ctrl_hold_out_split(rows, sizeof *rows, &n, 0.3, 42, &held, &n_held), CTRL_OK);
    CHECK_EQ_INT(n_held, 3);
    CHECK_EQ_INT(n, 7);
    static const int want_held[3] = {0, 3, 4}, want_kept[7] = {1, 2, 5, 6, 7, 8, 9};
    const row *h = held;
    for (int i = 0; i < 3; i++) CHECK(h[i].id == want_held[i] && h[i].pad[8] == 'a' + want_held[i]);
    for (int i = 0; i < 7; i++) CHECK(rows[i].id == want_kept[i] && rows[i].pad[8] == 'a' + want_kept[i]);
    free(held);
    n = 2;
    CHECK_EQ_INT(ctrl_hold_out_split(rows, sizeof *rows, &n, 0.9, 42, &held, &n_held), CTRL_ERR_CONFIG);
    CHECK(held == NULL && n == 2 && rows[0].id == 1 && rows[1].id == 2);
}

/* padding_free = false pads rows (wrapped packing, or none); bfd packing keeps the batch padding-free
 * whatever padding_free says, as TRL forces it. */
TEST(packing_and_padding_options_reach_the_dataset) {
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    static const char *const strategies[] = {"wrapped", "bfd", "bfd_split"};
    for (int k = 0; k < 3; k++) {
        char lines[256];
        snprintf(lines, sizeof lines,
                 "packing = true\npacking_strategy = %s\nmax_length = 32\npadding_free = false\n"
                 "pad_to_multiple_of = 8",
                 strategies[k]);
        ctrl_config *cfg = config_for(SFT_DIR "/prompt_completion.jsonl", lines);
        ctrl_dataset train, eval;
        CHECK_EQ_INT(ctrl_datasets_load(cfg, tok, &train, &eval), CTRL_OK);
        CHECK_EQ_INT(train.packed_from, 6);
        CHECK(train.n < 6);
        CHECK_EQ_INT(train.padded, k == 0);
        CHECK_EQ_INT(train.pad_multiple, 8);
        CHECK_EQ_INT(train.pad_id, ctrl_tokenizer_pad_id(tok));
        for (int i = 0; i < train.n; i++) CHECK(train.ex[i].len <= 32);
        ctrl_dataset_free(&train), ctrl_dataset_free(&eval);
        ctrl_config_free(cfg);
    }
    ctrl_tokenizer_free(tok);
}

/* TRL prepares the eval set with eval_packing (None: as packing): packed, it is neither truncated
 * nor filtered; unpacked, it is truncated to max_length and fully masked rows are dropped, giving
 * exactly TRL's truncated rows (the truncated_keep_start fixture: 6 rows, max_length 23, 3 kept). */
static void load_with_eval(const char *train_file, const char *lines, ctrl_dataset *train,
                           ctrl_dataset *eval) {
    char all[512];
    snprintf(all, sizeof all, "eval_file = %s\nmax_length = 23\n%s", SFT_DIR "/truncated_keep_start.jsonl",
             lines);
    ctrl_config *cfg = config_for(train_file, all);
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    CHECK_MSG(ctrl_datasets_load(cfg, tok, train, eval) == CTRL_OK, "%s", ctrl_error_message());
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
}

static void check_truncated_like_trl(const ctrl_dataset *d) {
    ctrl_status st;
    char *text = ctrl_read_text_file(SFT_DIR "/truncated_keep_start.expected.jsonl", 1 << 20, &st);
    int rows = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), rows++) {
        cJSON *r = cJSON_Parse(line);
        const cJSON *ids = cJSON_GetObjectItem(r, "input_ids");
        CHECK(rows < d->n && d->ex[rows].len == cJSON_GetArraySize(ids));
        for (int i = 0; rows < d->n && i < d->ex[rows].len && i < cJSON_GetArraySize(ids); i++)
            CHECK_EQ_INT(d->ex[rows].ids[i], cJSON_GetArrayItem(ids, i)->valueint);
        cJSON_Delete(r);
    }
    CHECK_EQ_INT(d->n, rows);
    free(text);
}

TEST(eval_set_packed_as_eval_packing_says) {
    ctrl_dataset train, eval;
    load_with_eval(SFT_DIR "/prompt_completion.jsonl", "packing = true", &train, &eval);
    CHECK_EQ_INT(eval.packed_from, 6); /* unset: packed like the train set, nothing dropped */
    CHECK_EQ_INT(eval.dropped_empty, 0);
    ctrl_dataset_free(&train), ctrl_dataset_free(&eval);

    load_with_eval(SFT_DIR "/prompt_completion.jsonl", "packing = true\neval_packing = false", &train, &eval);
    CHECK_EQ_INT(train.packed_from, 6);
    CHECK_EQ_INT(eval.packed_from, 0);
    CHECK_EQ_INT(eval.dropped_empty, 3);
    check_truncated_like_trl(&eval);
    ctrl_dataset_free(&train), ctrl_dataset_free(&eval);

    load_with_eval(SFT_DIR "/prompt_completion.jsonl", "eval_packing = true", &train, &eval);
    CHECK_EQ_INT(train.packed_from, 0);
    CHECK_EQ_INT(eval.packed_from, 6);
    ctrl_dataset_free(&train), ctrl_dataset_free(&eval);
}

/* A held-out share is taken from the rows as tokenized; the packed train set keeps every row, the
 * unpacked eval share is truncated and filtered like any unpacked set. */
TEST(eval_fraction_with_packed_train_and_unpacked_eval) {
    ctrl_config *cfg =
        config_for(SFT_DIR "/truncated_keep_start.jsonl",
                   "max_length = 23\npacking = true\neval_packing = false\neval_fraction = 0.5");
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    ctrl_dataset train, eval;
    CHECK_EQ_INT(ctrl_datasets_load(cfg, tok, &train, &eval), CTRL_OK);
    CHECK_EQ_INT(train.packed_from, 3);
    CHECK_EQ_INT(eval.packed_from, 0);
    CHECK_EQ_INT(eval.n + eval.dropped_empty, 3);
    for (int i = 0; i < eval.n; i++) CHECK(eval.ex[i].len <= 23);
    ctrl_dataset_free(&train), ctrl_dataset_free(&eval);
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
}
