/* Preference data against TRL 1.16's own preparation (fixtures from
 * tests/reference/make_pref_data_fixtures.py, which runs DPOTrainer, KTOTrainer and RewardTrainer):
 * for standard, conversational, implicit-prompt and unpaired rows, with the tiny tokenizer and
 * Qwen3's, Llama 3's and Llama 2's (BOS from the template or the tokenizer, EOS as the pad token), the prompt
 * / chosen / rejected / completion / KL ids ctrl prepares equal the trainers' train_dataset row for row (the
 * same rows dropped by max_length), and the micro-batch built padded equals the trainer's data_collator
 * output (max_length truncation in both modes, pad_to_multiple_of, the completion mask as weights shifted by
 * one). Covered too: [data] chat_template_path (the tokenizer's template replaced, RewardConfig's
 * chat_template_path), the rows' tools and chat_template_kwargs (Qwen3's enable_thinking). The tiny model's
 * per-sequence log-probs summed over ctrl's batch (padded and padding-free) equal TRL's own
 * (compute_ref_log_probs) within 1e-5 relative. Also: padding-free layout, max_prompt_length /
 * max_completion_length, bad rows (file:line and the column) and skip_bad_rows, refused [data]
 * keys, the eval_fraction hold-out. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "file_text.h"
#include "test.h"
#include "test_registry.h"
#include "train/pref_data.h"
#include "train/sequence.h"

#define PREF_DIR CTRL_FIXTURE_DIR "/pref"
#define LOGP_MODEL CTRL_FIXTURE_DIR "/trl_sft/model" /* the tiny tokenizer's vocabulary */

static const char *shared_dir(void) {
    const char *env = getenv("CTRL_SHARED_DIR");
    return env && *env ? env : CTRL_SHARED_DIR;
}

/* A config with [data] train_file = path, the given [data] lines and the train batch size. */
static ctrl_config *config_for(const char *train_file, const char *data_lines, int batch_size) {
    char ini[4096];
    snprintf(ini, sizeof ini,
             "[run]\noutput_dir = %s/out\n[model]\npath = %s/models/qwen2\n[train]\n"
             "per_device_train_batch_size = %d\n[data]\ntrain_file = %s\n%s\n",
             test_tmp_dir(), CTRL_FIXTURE_DIR, batch_size, train_file, data_lines);
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "run.ini", ini);
    ctrl_registry_destroy(reg);
    return cfg;
}

static ctrl_sequence_spec spec_for(const char *task) {
    ctrl_sequence_spec s = {.size = sizeof s, .paired = strcmp(task, "kto") != 0};
    s.needs_score = !strcmp(task, "reward");
    s.kl_sequences = !strcmp(task, "kto");
    return s;
}

static cJSON *read_json(const char *path) {
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 22, &st);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    return o;
}

static int same_ids(const cJSON *want, const int32_t *ids, int n) {
    if (cJSON_GetArraySize(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (cJSON_GetArrayItem(want, i)->valueint != ids[i]) return 0;
    return 1;
}

/* One loaded case: its options, tokenizer, config and set (NULL tok: skipped). */
typedef struct pref_case {
    cJSON *opts;
    const char *task;
    int bs;
    ctrl_tokenizer *tok;
    ctrl_config *cfg;
    ctrl_pref_set set;
} pref_case;

static int case_open(const char *name, const char *extra, pref_case *c) {
    memset(c, 0, sizeof *c);
    char path[1024], data[2048] = "";
    snprintf(path, sizeof path, PREF_DIR "/%s.options.json", name);
    c->opts = read_json(path);
    CHECK_MSG(c->opts != NULL, "%s: no options", name);
    if (!c->opts) return 0;
    c->task = cJSON_GetObjectItem(c->opts, "task")->valuestring;
    c->bs = cJSON_GetObjectItem(c->opts, "batch_size")->valueint;
    const char *tok_name = cJSON_GetObjectItem(c->opts, "tokenizer")->valuestring;
    if (!strcmp(tok_name, "tiny"))
        snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe");
    else
        snprintf(path, sizeof path, "%s/data/tokenizers/%s", shared_dir(), tok_name);
    if (ctrl_tokenizer_load(path, &c->tok) != CTRL_OK) {
        c->tok = NULL;
        return 0; /* the shared tokenizer is absent */
    }
    const cJSON *k;
    size_t n = 0;
    cJSON_ArrayForEach(k, cJSON_GetObjectItem(c->opts, "data")) {
        if (cJSON_IsString(k) && !strcmp(k->string, "chat_template_path"))
            n += (size_t)snprintf(data + n, sizeof data - n, "%s = %s/%s\n", k->string, CTRL_FIXTURE_DIR,
                                  k->valuestring);
        else if (cJSON_IsString(k))
            n += (size_t)snprintf(data + n, sizeof data - n, "%s = %s\n", k->string, k->valuestring);
        else if (cJSON_IsNumber(k))
            n += (size_t)snprintf(data + n, sizeof data - n, "%s = %d\n", k->string, k->valueint);
    }
    snprintf(data + n, sizeof data - n, "%s", extra ? extra : "");
    snprintf(path, sizeof path, PREF_DIR "/%s.jsonl", name);
    c->cfg = config_for(path, data, c->bs);
    if (!c->cfg) return 0;
    const ctrl_sequence_spec spec = spec_for(c->task);
    ctrl_status st = ctrl_pref_set_load(path, c->tok, c->cfg, &spec, &c->set);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    return st == CTRL_OK;
}

static void case_close(pref_case *c) {
    ctrl_pref_set_free(&c->set);
    ctrl_config_free(c->cfg);
    ctrl_tokenizer_free(c->tok);
    cJSON_Delete(c->opts);
}

/* The set's rows equal TRL's train_dataset rows. */
static int rows_match(const char *name, const pref_case *c) {
    char path[1024];
    snprintf(path, sizeof path, PREF_DIR "/%s.expected.jsonl", name);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 22, &st);
    CHECK(text != NULL);
    int rows = 0;
    const ctrl_pref_set *s = &c->set;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"), rows++) {
        cJSON *e = cJSON_Parse(line);
        if (rows >= s->n) {
            cJSON_Delete(e);
            continue;
        }
        const ctrl_pref_row *r = &s->rows[rows];
        int ok = 1;
        if (!strcmp(c->task, "dpo")) {
            ok = same_ids(cJSON_GetObjectItem(e, "prompt_ids"), r->prompt, r->n_prompt) &&
                 same_ids(cJSON_GetObjectItem(e, "chosen_ids"), r->chosen, r->n_chosen) &&
                 same_ids(cJSON_GetObjectItem(e, "rejected_ids"), r->rejected, r->n_rejected);
        } else if (!strcmp(c->task, "kto")) {
            const ctrl_pref_row *kl = r->kl_row >= 0 ? &s->rows[r->kl_row] : NULL;
            ok = same_ids(cJSON_GetObjectItem(e, "prompt_ids"), r->prompt, r->n_prompt) &&
                 same_ids(cJSON_GetObjectItem(e, "completion_ids"), r->chosen, r->n_chosen) && kl &&
                 same_ids(cJSON_GetObjectItem(e, "KL_completion_ids"), kl->chosen, kl->n_chosen) &&
                 r->label == (float)cJSON_IsTrue(cJSON_GetObjectItem(e, "label"));
        } else {
            const cJSON *m = cJSON_GetObjectItem(e, "margin");
            ok = r->n_prompt == 0 && same_ids(cJSON_GetObjectItem(e, "chosen_ids"), r->chosen, r->n_chosen) &&
                 same_ids(cJSON_GetObjectItem(e, "rejected_ids"), r->rejected, r->n_rejected) &&
                 (!m || r->margin == (float)m->valuedouble) && s->has_margin == (m != NULL);
        }
        CHECK_MSG(ok, "%s row %d differs from TRL's", name, rows);
        cJSON_Delete(e);
    }
    CHECK_MSG(s->n == rows, "%s: %d rows, TRL keeps %d", name, s->n, rows);
    free(text);
    return rows;
}

/* Sequence k of a batch equals row k of TRL's collated tensors (prefix "" or "KL_"): the tokens,
 * the padded width, the attention mask as seq_len, the completion mask shifted by one as the
 * weights and its sum as n_completion (a reward batch has none), and `last` is transformers' last
 * non-pad token. */
static void check_group(const char *name, const pref_case *c, const ctrl_pref_batch *b, const cJSON *batch,
                        const char *prefix, int k0) {
    char key[64];
    snprintf(key, sizeof key, "%sinput_ids", prefix);
    const cJSON *ids = cJSON_GetObjectItem(batch, key);
    snprintf(key, sizeof key, "%sattention_mask", prefix);
    const cJSON *att = cJSON_GetObjectItem(batch, key);
    snprintf(key, sizeof key, "%scompletion_mask", prefix);
    const cJSON *cm = cJSON_GetObjectItem(batch, key);
    const int pad = cJSON_GetObjectItem(batch, "pad_token_id")->valueint;
    for (int i = 0; i < cJSON_GetArraySize(ids); i++) {
        const int k = k0 + i, start = b->seq_cu[k];
        const cJSON *row = cJSON_GetArrayItem(ids, i);
        const int width = cJSON_GetArraySize(row);
        int ok = b->seq_cu[k + 1] - start == width, real = 0, last = 0;
        for (int j = 0; ok && j < width; j++) {
            const int id = cJSON_GetArrayItem(row, j)->valueint;
            ok &= b->batch.tokens[start + j] == id;
            real += cJSON_GetArrayItem(cJSON_GetArrayItem(att, i), j)->valueint;
            if (id != pad) last = j;
            const int next =
                cm && j + 1 < width ? cJSON_GetArrayItem(cJSON_GetArrayItem(cm, i), j + 1)->valueint : 0;
            ok &= b->weight[start + j] == (float)next;
            ok &= next ? b->batch.targets[start + j] == cJSON_GetArrayItem(row, j + 1)->valueint
                       : b->batch.targets[start + j] == -100;
        }
        ok &= real == b->seq_len[k] && b->last[k] == start + last;
        /* the completion tokens IPO and sigmoid_norm divide by: TRL's completion_mask sum */
        int completion = 0;
        for (int j = 0; cm && j < width; j++)
            completion += cJSON_GetArrayItem(cJSON_GetArrayItem(cm, i), j)->valueint;
        CHECK_MSG(!cm || b->n_completion[k] == completion, "%s: %ssequence %d: %d completion tokens, TRL %d",
                  name, prefix, i, b->n_completion[k], completion);
        CHECK_MSG(ok, "%s: %ssequence %d differs from TRL's collated batch", name, prefix, i);
    }
    (void)c;
}

/* The model's per-sequence log-probs over a built batch: sum of logp * weight over seq_cu, as the
 * sequence kind computes them (train_sequence_sums). */
static void sequence_logps(const ctrl_pref_batch *b, double *sum) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    ctrl_model *m = NULL;
    CHECK(attn && ctrl_model_load(LOGP_MODEL, attn->plugin->ops, &m) == CTRL_OK);
    float *lp = calloc((size_t)b->T, sizeof(float));
    if (m) CHECK_EQ_INT(ctrl_model_forward(m, &b->batch, lp, NULL, NULL), CTRL_OK);
    train_sequence_sums(b->n_seq, b->seq_cu, lp, b->weight, sum, NULL);
    free(lp);
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

/* TRL's own sequence log-probs of the batch (compute_ref_log_probs) equal the sums over ctrl's
 * batch, padded and padding-free: the weights mark exactly the log-probs TRL sums. */
static void logps_match(const char *name, const ctrl_pref_batch *b, const cJSON *want, const char *layout) {
    if (!want) return;
    CHECK_EQ_INT(cJSON_GetArraySize(want), b->n_seq);
    double *sum = calloc((size_t)b->n_seq, sizeof(double));
    sequence_logps(b, sum);
    for (int k = 0; k < b->n_seq && k < cJSON_GetArraySize(want); k++) {
        const double w = cJSON_GetArrayItem(want, k)->valuedouble;
        CHECK_MSG(fabs(sum[k] - w) <= 1e-5 * fabs(w), "%s (%s): sequence %d log-prob %.9g, TRL %.9g", name,
                  layout, k, sum[k], w);
    }
    free(sum);
}

static void batch_matches(const char *name, pref_case *c) {
    char path[1024];
    snprintf(path, sizeof path, PREF_DIR "/%s.batch.json", name);
    cJSON *batch = read_json(path);
    CHECK(batch != NULL);
    if (!batch) return;
    int idx[16], n = c->bs < c->set.n ? c->bs : c->set.n;
    for (int i = 0; i < n; i++) idx[i] = i;
    ctrl_pref_batch b;
    c->set.padded = 1; /* TRL's collators pad */
    CHECK_EQ_INT(ctrl_pref_batch_build(&c->set, idx, n, &b), CTRL_OK);
    CHECK_EQ_INT(b.n_seq, c->set.paired || c->set.has_kl ? 2 * n : n);
    check_group(name, c, &b, batch, "", 0);
    if (c->set.has_kl) check_group(name, c, &b, batch, "KL_", n);
    if (c->set.has_margin) {
        const cJSON *m = cJSON_GetObjectItem(batch, "margin");
        for (int i = 0; i < n; i++) CHECK_NEAR(b.margin[i], cJSON_GetArrayItem(m, i)->valuedouble, 1e-7);
    }
    if (b.label) {
        const cJSON *l = cJSON_GetObjectItem(batch, "label");
        for (int i = 0; i < n; i++) CHECK_EQ_INT(b.label[i], cJSON_IsTrue(cJSON_GetArrayItem(l, i)));
    }
    logps_match(name, &b, cJSON_GetObjectItem(batch, "logps"), "padded");
    ctrl_pref_batch_free(&b);
    /* padding-free: the same sequences back to back, the flat batch rounded to pad_to_multiple_of */
    c->set.padded = 0;
    CHECK_EQ_INT(ctrl_pref_batch_build(&c->set, idx, n, &b), CTRL_OK);
    long real = 0, counted = 0;
    for (int k = 0; k < b.n_seq; k++) {
        CHECK_EQ_INT(b.seq_cu[k] + b.seq_len[k],
                     k + 1 < b.n_seq ? b.seq_cu[k + 1] : b.seq_cu[k] + b.seq_len[k]);
        real += b.seq_len[k];
        counted += b.kl && b.kl[k] ? 0 : b.seq_len[k];
    }
    const int m = c->set.pad_multiple > 1 ? c->set.pad_multiple : 1;
    CHECK_EQ_INT(b.T, (real + m - 1) / m * m);
    CHECK_EQ_INT(b.tokens, counted); /* TRL's num_tokens: the main batch's attention mask */
    CHECK_EQ_INT(b.seq_cu[b.n_seq], b.T);
    CHECK_EQ_INT(b.batch.cu_seqlens[b.batch.B], b.T);
    logps_match(name, &b, cJSON_GetObjectItem(batch, "logps"), "padding-free");
    ctrl_pref_batch_free(&b);
    cJSON_Delete(batch);
}

static void compare_with_trl(const char *name) {
    pref_case c;
    const int ok = case_open(name, NULL, &c);
    if (!c.tok && c.opts) {
        case_close(&c);
        TEST_SKIP("the shared tokenizer files (../shared/data/tokenizers) are absent");
    }
    if (ok && rows_match(name, &c) > 0) batch_matches(name, &c);
    case_close(&c);
}

#define TRL_CASE(name)                                                                                       \
    TEST(name##_matches_trl) { compare_with_trl(#name); }

TRL_CASE(dpo_standard)
TRL_CASE(dpo_conversational)
TRL_CASE(dpo_implicit)
TRL_CASE(dpo_implicit_conversational)
TRL_CASE(dpo_keep_start)
TRL_CASE(dpo_keep_end)
TRL_CASE(dpo_empty_prompt)
TRL_CASE(dpo_standard_qwen3)
TRL_CASE(dpo_conversational_qwen3)
TRL_CASE(dpo_template_kwargs_qwen3)
TRL_CASE(dpo_implicit_conversational_qwen3)
TRL_CASE(dpo_chat_template)
TRL_CASE(dpo_standard_llama3)
TRL_CASE(dpo_conversational_llama3)
TRL_CASE(dpo_implicit_llama2)
TRL_CASE(dpo_standard_llama2)
TRL_CASE(kto_unpaired_llama3)
TRL_CASE(reward_standard_llama3)
TRL_CASE(reward_conversational_llama3)
TRL_CASE(kto_unpaired)
TRL_CASE(kto_paired)
TRL_CASE(kto_implicit)
TRL_CASE(kto_max_length)
TRL_CASE(kto_conversational_qwen3)
TRL_CASE(kto_template_kwargs_qwen3)
TRL_CASE(reward_standard)
TRL_CASE(reward_conversational)
TRL_CASE(reward_chat_template)
TRL_CASE(reward_implicit)
TRL_CASE(reward_pretokenized)
TRL_CASE(reward_pretokenized_legacy)
TRL_CASE(reward_max_length)
TRL_CASE(reward_conversational_qwen3)

/* max_prompt_length keeps the end of TRL's prompt ids, max_completion_length the start of its
 * completion ids, before max_length's filter and cut. */
TEST(prompt_and_completion_lengths_cut_trl_ids) {
    pref_case full, cut;
    CHECK(case_open("dpo_standard", NULL, &full));
    CHECK(case_open("dpo_standard", "max_prompt_length = 5\nmax_completion_length = 2\n", &cut));
    CHECK_EQ_INT(cut.set.n, full.set.n);
    for (int i = 0; i < cut.set.n && i < full.set.n; i++) {
        const ctrl_pref_row *a = &full.set.rows[i], *b = &cut.set.rows[i];
        CHECK_EQ_INT(b->n_prompt, a->n_prompt < 5 ? a->n_prompt : 5);
        CHECK(!memcmp(b->prompt, a->prompt + (a->n_prompt - b->n_prompt),
                      sizeof(int32_t) * (size_t)b->n_prompt));
        CHECK_EQ_INT(b->n_chosen, a->n_chosen < 2 ? a->n_chosen : 2);
        CHECK_EQ_INT(b->n_rejected, a->n_rejected < 2 ? a->n_rejected : 2);
        CHECK(!memcmp(b->chosen, a->chosen, sizeof(int32_t) * (size_t)b->n_chosen));
        CHECK(!memcmp(b->rejected, a->rejected, sizeof(int32_t) * (size_t)b->n_rejected));
    }
    CHECK(cut.set.truncated > 0);
    case_close(&full), case_close(&cut);
}

static ctrl_status load_text(const char *rows, const char *task, const char *data_lines, ctrl_pref_set *s) {
    char path[1024];
    snprintf(path, sizeof path, "%s/pref_rows.jsonl", test_tmp_dir());
    FILE *f = fopen(path, "w");
    fputs(rows, f);
    fclose(f);
    ctrl_config *cfg = config_for(path, data_lines, 2);
    if (!cfg) return CTRL_ERR_CONFIG;
    ctrl_tokenizer *tok;
    ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok);
    const ctrl_sequence_spec spec = spec_for(task);
    ctrl_status st = ctrl_pref_set_load(path, tok, cfg, &spec, s);
    ctrl_tokenizer_free(tok);
    ctrl_config_free(cfg);
    return st;
}

TEST(bad_rows_name_file_line_and_column) {
    static const struct {
        const char *task, *row, *why;
    } bad[] = {
        {"dpo", "not json", "not valid JSON"},
        {"dpo", "[1, 2]", "not a JSON object"},
        {"dpo", "{\"prompt\": \"a\", \"chosen\": \"b\"}", "column \"rejected\" is missing"},
        {"dpo", "{\"prompt\": \"a\", \"chosen\": 3, \"rejected\": \"c\"}", "column \"chosen\""},
        {"dpo",
         "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"chosen\": \"b\", \"rejected\": \"c\"}",
         "column \"chosen\" must be a non-empty list of messages"},
        {"dpo", "{\"chosen\": \"same\", \"rejected\": [{\"role\": \"user\", \"content\": \"x\"}]}",
         "columns \"chosen\" and \"rejected\" must both be strings"},
        {"dpo", "{\"chosen\": \"\", \"rejected\": \"x\"}", "must not be empty"},
        {"dpo", "{\"prompt\": \"a\", \"completion\": \"b\", \"label\": true}", "needs columns \"chosen\""},
        {"kto", "{\"prompt\": \"a\", \"completion\": \"b\"}", "column \"label\" is missing"},
        {"kto", "{\"prompt\": \"a\", \"completion\": \"b\", \"label\": \"yes\"}", "column \"label\" must be"},
        {"kto", "{\"completion\": \"b\", \"label\": true}", "column \"prompt\" is missing"},
        {"reward", "{\"chosen\": \"a\", \"rejected\": \"b\", \"margin\": \"big\"}", "column \"margin\""},
        {"reward", "{\"chosen_ids\": [1, -2], \"rejected_ids\": [3]}", "\"chosen_ids\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char rows[512];
        const char *good = !strcmp(bad[i].task, "kto")
                               ? "{\"prompt\": \"p\", \"completion\": \"c\", \"label\": false}"
                               : "{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"r\"}";
        snprintf(rows, sizeof rows, "%s\n\n%s\n%s\n", good, bad[i].row, good);
        ctrl_pref_set s;
        CHECK_EQ_INT(load_text(rows, bad[i].task, "", &s), CTRL_ERR_FORMAT);
        CHECK_CONTAINS(ctrl_error_message(), "pref_rows.jsonl:3: ");
        CHECK_CONTAINS(ctrl_error_message(), bad[i].why);
        /* skip_bad_rows: the row is counted and left out */
        CHECK_EQ_INT(load_text(rows, bad[i].task, "skip_bad_rows = true", &s), CTRL_OK);
        CHECK_EQ_INT(s.n, 2);
        CHECK_EQ_INT(s.skipped_bad, 1);
        CHECK_EQ_INT(s.rows[1].line, 4);
        ctrl_pref_set_free(&s);
    }
}

TEST(keys_that_do_not_apply_are_refused_where_set) {
    static const struct {
        const char *task, *line, *key;
    } refused[] = {
        {"dpo", "packing = true", "[data] packing"},
        {"dpo", "completion_only_loss = true", "[data] completion_only_loss"},
        {"dpo", "assistant_only_loss = true", "[data] assistant_only_loss"},
        {"dpo", "dataset_text_field = body", "[data] dataset_text_field"},
        {"dpo", "completion_field = answer", "[data] completion_field"},
        {"kto", "truncation_mode = keep_end", "[data] truncation_mode"},
        {"reward", "truncation_mode = keep_end", "[data] truncation_mode"},
        {"reward", "max_prompt_length = 8", "[data] max_prompt_length"},
        {"reward", "max_completion_length = 8", "[data] max_completion_length"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ctrl_pref_set s;
        CHECK_EQ_INT(load_text("{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"r\"}\n",
                               refused[i].task, refused[i].line, &s),
                     CTRL_ERR_CONFIG);
        CHECK_CONTAINS(ctrl_error_message(), "run.ini:9: ");
        CHECK_CONTAINS(ctrl_error_message(), refused[i].key);
    }
}

/* prompt_field / completion_field name the columns KTO reads. */
TEST(prompt_and_completion_fields_are_honoured) {
    ctrl_pref_set s;
    CHECK_EQ_INT(load_text("{\"q\": \"Q: hi A:\", \"a\": \" yo\", \"label\": true}\n", "kto",
                           "prompt_field = q\ncompletion_field = a", &s),
                 CTRL_OK);
    CHECK_EQ_INT(s.n, 1);
    CHECK(s.rows[0].n_prompt > 0 && s.rows[0].n_chosen > 0);
    CHECK_EQ_INT(s.rows[0].kl_row, 0); /* a chunk of one row is its own KL partner */
    ctrl_pref_set_free(&s);
}

/* eval_fraction holds out a seeded share of the prepared rows; every row lands in one set. */
TEST(eval_fraction_holds_out_rows) {
    ctrl_tokenizer *tok;
    CHECK_EQ_INT(ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok), CTRL_OK);
    ctrl_config *cfg = config_for(PREF_DIR "/kto_unpaired.jsonl", "eval_fraction = 0.3", 3);
    const ctrl_sequence_spec spec = spec_for("kto");
    ctrl_pref_set train, eval;
    CHECK_EQ_INT(ctrl_pref_sets_load(cfg, tok, &spec, &train, &eval), CTRL_OK);
    CHECK_EQ_INT(train.n + eval.n, 7);
    CHECK_EQ_INT(eval.n, 2); /* round(7 * 0.3) */
    CHECK(train.has_kl && eval.has_kl);
    ctrl_pref_set_describe(&train, "train"), ctrl_pref_set_describe(&eval, "eval");
    for (int i = 0; i < eval.n; i++) CHECK(eval.rows[i].kl_row >= 0 && eval.rows[i].kl_row < eval.n);
    ctrl_pref_set_free(&train), ctrl_pref_set_free(&eval);
    ctrl_config_free(cfg);
    ctrl_tokenizer_free(tok);
}

/* A template that fails on a row (raise_exception) makes that row bad: file:line, or skipped. A
 * template that cannot be loaded stops the run. */
TEST(chat_template_errors_on_a_row_are_bad_rows) {
    char tpl[1024], lines[1200];
    snprintf(tpl, sizeof tpl, "%s/strict.jinja", test_tmp_dir());
    FILE *f = fopen(tpl, "w");
    fputs("{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
          "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: "
          "{% endif %}",
          f);
    fclose(f);
    const char *good =
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": [{\"role\": "
        "\"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": "
        "\"b\"}]}\n";
    char rows[1024];
    snprintf(rows, sizeof rows,
             "%s{\"prompt\": [{\"role\": \"bad\", \"content\": \"x\"}], \"chosen\": [{\"role\": "
             "\"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", "
             "\"content\": \"b\"}]}\n%s",
             good, good);
    ctrl_pref_set s;
    snprintf(lines, sizeof lines, "chat_template_path = %s", tpl);
    CHECK_EQ_INT(load_text(rows, "dpo", lines, &s), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "pref_rows.jsonl:2: ");
    CHECK_CONTAINS(ctrl_error_message(), "no bad roles");
    snprintf(lines, sizeof lines, "chat_template_path = %s\nskip_bad_rows = true", tpl);
    CHECK_EQ_INT(load_text(rows, "dpo", lines, &s), CTRL_OK);
    CHECK_EQ_INT(s.n, 2);
    CHECK_EQ_INT(s.skipped_bad, 1);
    ctrl_pref_set_free(&s);
    /* a template that does not compile is the run's error, even with skip_bad_rows */
    f = fopen(tpl, "w");
    fputs("{% for m in messages %}", f);
    fclose(f);
    CHECK(load_text(rows, "dpo", lines, &s) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "strict.jinja");
}
