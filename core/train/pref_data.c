/* Preference sets (pref_data.h): rows read and tokenized (pref_format.c), unpaired for KTO as
 * TRL's unpair_preference_dataset, truncated and filtered as TRL's trainers, the KL pairing of
 * KTO, the held-out share. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "config/config_load.h"
#include "train/pref_format.h"
#include "train/row_reader.h"
#include "train/train.h"

#define UNPAIR_CHUNK 1000 /* datasets' map batch size, over which TRL unpairs rows */

ctrl_pref_task ctrl_pref_task_for(const ctrl_sequence_spec *spec) {
    return spec->needs_score ? CTRL_PREF_REWARD : spec->paired ? CTRL_PREF_DPO : CTRL_PREF_KTO;
}

static const char *task_name(ctrl_pref_task t) {
    return t == CTRL_PREF_DPO ? "DPO" : t == CTRL_PREF_KTO ? "KTO" : "reward";
}

/* [data] keys that mean nothing for this task's data are refused where they were set. */
static ctrl_status check_keys(const ctrl_config *cfg, ctrl_pref_task task) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    static const char *const sft_only[] = {"dataset_text_field", "messages_field", "completion_only_loss",
                                           "assistant_only_loss", "packing_strategy"};
    struct {
        const char *key;
        int refused;
        const char *why;
    } checks[] = {
        {"packing", s->data.packing, "preference pairs are not packed"},
        {"eval_packing", s->data.eval_packing == 1, "preference pairs are not packed"},
        {"completion_field", task != CTRL_PREF_KTO, "only unpaired (KTO) rows have a completion column"},
        {"truncation_mode",
         task != CTRL_PREF_DPO && s->data.truncation_mode &&
             strcmp(s->data.truncation_mode, "keep_start") != 0,
         task == CTRL_PREF_KTO
             ? "TRL's KTO keeps the start of every sequence"
             : "the reward trainer drops pairs longer than max_length instead of cutting them"},
        {"max_prompt_length", task == CTRL_PREF_REWARD && s->data.max_prompt_length > 0,
         "the reward trainer scores whole sequences (no prompt is split off)"},
        {"max_completion_length", task == CTRL_PREF_REWARD && s->data.max_completion_length > 0,
         "the reward trainer scores whole sequences (no prompt is split off)"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        const char *where = ctrl_config_where(cfg, "data", checks[i].key);
        if (checks[i].refused && where && strcmp(where, "default") != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [data] %s does not apply to %s data: %s", where,
                                  checks[i].key, task_name(task), checks[i].why);
    }
    for (size_t i = 0; i < sizeof sft_only / sizeof sft_only[0]; i++) {
        const char *where = ctrl_config_where(cfg, "data", sft_only[i]);
        if (where && strcmp(where, "default") != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [data] %s applies to SFT data only, not to %s data",
                                  where, sft_only[i], task_name(task));
    }
    return CTRL_OK;
}

static ctrl_status push_row(ctrl_pref_set *s, ctrl_pref_row *r) {
    if ((s->n & (s->n - 1)) == 0) { /* grow at powers of two */
        ctrl_pref_row *rows = realloc(s->rows, sizeof *rows * (size_t)(s->n ? 2 * s->n : 1));
        if (!rows) return pref_row_free(r), ctrl_error_set(CTRL_ERR_NOMEM, "preference data: out of memory");
        s->rows = rows;
    }
    s->rows[s->n++] = *r;
    memset(r, 0, sizeof *r);
    return CTRL_OK;
}

/* Steps 1-3 of pref_data.h's truncation; 1 when the row is kept. */
static int fit_row(ctrl_pref_set *s, ctrl_pref_row *r, int max_prompt, int max_completion) {
    if (s->task == CTRL_PREF_REWARD)
        return r->n_chosen <= s->max_length && r->n_rejected <= s->max_length ? 1 : (s->dropped++, 0);
    int cut = 0;
    if (max_prompt > 0 && r->n_prompt > max_prompt) { /* keep the prompt's end */
        memmove(r->prompt, r->prompt + (r->n_prompt - max_prompt), sizeof(int32_t) * (size_t)max_prompt);
        r->n_prompt = max_prompt, cut = 1;
    }
    if (max_completion > 0 && r->n_chosen > max_completion) r->n_chosen = max_completion, cut = 1;
    if (max_completion > 0 && r->rejected && r->n_rejected > max_completion)
        r->n_rejected = max_completion, cut = 1;
    s->truncated += cut;
    /* TRL drops a row whose prompt alone fills max_length when the start is kept */
    if (!s->keep_end && r->n_prompt >= s->max_length) return s->dropped++, 0;
    return 1;
}

/* A row that would give a sequence without a token is malformed (nothing for the model to read). */
static const char *empty_sequence(const ctrl_pref_set *s, const ctrl_pref_row *r) {
    if (r->n_prompt + r->n_chosen == 0) return "column \"chosen\" (or \"completion\") gives no token";
    if (s->paired && r->n_prompt + r->n_rejected == 0) return "column \"rejected\" gives no token";
    return NULL;
}

/* Reads path into *out (rows not yet KL-paired). */
static ctrl_status load_rows(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                             ctrl_pref_task task, ctrl_pref_set *out) {
    const ctrl_run_settings *set = ctrl_config_settings(cfg);
    memset(out, 0, sizeof *out);
    out->task = task, out->paired = task != CTRL_PREF_KTO;
    out->max_length = set->data.max_length;
    out->keep_end =
        task == CTRL_PREF_DPO && set->data.truncation_mode && !strcmp(set->data.truncation_mode, "keep_end");
    out->padded = !set->data.padding_free;
    out->pad_multiple = set->data.pad_to_multiple_of;
    int32_t pad = ctrl_tokenizer_pad_id(tok);
    if (pad < 0) pad = ctrl_tokenizer_eos_id(tok); /* TRL pads with EOS when the tokenizer has no pad token */
    out->pad_id = pad < 0 ? 0 : pad;
    ctrl_status st = check_keys(cfg, task);
    if (st != CTRL_OK) return st;
    ctrl_row_reader *rd;
    if ((st = ctrl_row_reader_open_data(path, cfg, &rd)) != CTRL_OK) return st;
    pref_format *fmt;
    if ((st = pref_format_create(tok, cfg, task, &fmt)) != CTRL_OK) {
        ctrl_row_reader_close(rd);
        return st;
    }
    /* KTO unpairs paired rows per UNPAIR_CHUNK rows: that chunk's chosen halves, then its rejected */
    ctrl_pref_row *held = task == CTRL_PREF_KTO ? calloc(UNPAIR_CHUNK, sizeof *held) : NULL;
    int n_held = 0, n_chunk = 0;
    if (task == CTRL_PREF_KTO && !held) st = ctrl_error_set(CTRL_ERR_NOMEM, "preference data: out of memory");
    cJSON *o;
    long line;
    int more;
    char why_buf[1024];
    while (st == CTRL_OK && (more = ctrl_row_reader_next(rd, &o, &line)) != 0) {
        if (more < 0) {
            st = CTRL_ERR_FORMAT;
            break;
        }
        ctrl_pref_row r[2];
        int n = 0;
        const char *why = o ? NULL : "not valid JSON";
        if (o) st = pref_format_row(fmt, o, r, &n, &why, why_buf, sizeof why_buf);
        cJSON_Delete(o);
        if (st != CTRL_OK) {
            ctrl_error_wrap(st, "%s:%ld", ctrl_row_reader_file(rd), line);
            break;
        }
        for (int k = 0; k < n && !why; k++) why = empty_sequence(out, &r[k]);
        if (why) {
            for (int k = 0; k < n; k++) pref_row_free(&r[k]);
            if (!set->data.skip_bad_rows) {
                st = ctrl_error_set(CTRL_ERR_FORMAT, "%s:%ld: %s", ctrl_row_reader_file(rd), line, why);
                break;
            }
            out->skipped_bad++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            r[k].line = line;
            if (isnan(r[k].margin))
                r[k].margin = 0;
            else
                out->has_margin = 1;
        }
        if (n == 2) held[n_held++] = r[1]; /* KTO: the rejected half waits for the chunk's end */
        if (st == CTRL_OK) st = push_row(out, &r[0]);
        if (task == CTRL_PREF_KTO && (++n_chunk == UNPAIR_CHUNK)) {
            for (int k = 0; k < n_held && st == CTRL_OK; k++) st = push_row(out, &held[k]);
            n_held = n_chunk = 0;
        }
    }
    for (int k = 0; k < n_held && st == CTRL_OK; k++) st = push_row(out, &held[k]);
    for (int k = 0; held && k < n_held; k++) pref_row_free(&held[k]);
    free(held);
    pref_format_free(fmt);
    ctrl_row_reader_close(rd);
    /* truncation and TRL's filters, after unpairing as TRL orders them */
    int kept = 0;
    for (int i = 0; i < out->n; i++) {
        if (st == CTRL_OK &&
            fit_row(out, &out->rows[i], set->data.max_prompt_length, set->data.max_completion_length))
            out->rows[kept++] = out->rows[i];
        else
            pref_row_free(&out->rows[i]);
    }
    out->n = kept;
    if (st == CTRL_OK && out->n == 0)
        st = ctrl_error_set(CTRL_ERR_FORMAT,
                            "%s: no preference row left (%ld malformed, %ld over max_length = %d)", path,
                            out->skipped_bad, out->dropped, out->max_length);
    if (st != CTRL_OK) ctrl_pref_set_free(out);
    return st;
}

/* KTO's KL sequences: within consecutive chunks of `chunk` rows, row i takes row i - 1's completion
 * and the chunk's first row its last's (TRL's add_kl_completion_ids). */
static void pair_kl(ctrl_pref_set *s, int chunk) {
    s->has_kl = 1;
    for (int c0 = 0; c0 < s->n; c0 += chunk) {
        const int c1 = c0 + chunk < s->n ? c0 + chunk : s->n;
        for (int i = c0; i < c1; i++) s->rows[i].kl_row = i == c0 ? c1 - 1 : i - 1;
    }
}

ctrl_status ctrl_pref_set_load(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                               const ctrl_sequence_spec *spec, ctrl_pref_set *out) {
    const ctrl_pref_task task = ctrl_pref_task_for(spec);
    ctrl_status st = load_rows(path, tok, cfg, task, out);
    if (st == CTRL_OK && task == CTRL_PREF_KTO && spec->kl_sequences)
        pair_kl(out, ctrl_config_settings(cfg)->train.per_device_train_batch_size);
    return st;
}

/* Moves the seeded eval_fraction of train's rows to eval (both keep file order). */
static ctrl_status hold_out(ctrl_pref_set *train, ctrl_pref_set *eval, double fraction, uint64_t seed) {
    void *held;
    int n_held;
    ctrl_status st =
        ctrl_hold_out_split(train->rows, sizeof *train->rows, &train->n, fraction, seed, &held, &n_held);
    if (st != CTRL_OK) return st;
    *eval = *train; /* the layout's settings */
    eval->rows = held, eval->n = n_held, eval->skipped_bad = eval->dropped = eval->truncated = 0;
    return CTRL_OK;
}

ctrl_status ctrl_pref_sets_load(const ctrl_config *cfg, const ctrl_tokenizer *tok,
                                const ctrl_sequence_spec *spec, ctrl_pref_set *train, ctrl_pref_set *eval) {
    memset(train, 0, sizeof *train), memset(eval, 0, sizeof *eval);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    if (!s->data.train_file)
        return ctrl_error_set(CTRL_ERR_CONFIG, "config: [data] train_file is required to train");
    const ctrl_pref_task task = ctrl_pref_task_for(spec);
    ctrl_status st = load_rows(s->data.train_file, tok, cfg, task, train);
    if (st == CTRL_OK && s->data.eval_file)
        st = load_rows(s->data.eval_file, tok, cfg, task, eval);
    else if (st == CTRL_OK && s->data.eval_fraction > 0)
        st = hold_out(train, eval, s->data.eval_fraction, s->run.seed);
    if (st == CTRL_OK && task == CTRL_PREF_KTO && spec->kl_sequences) {
        pair_kl(train, s->train.per_device_train_batch_size);
        if (eval->n) pair_kl(eval, s->train.per_device_train_batch_size);
    }
    if (st != CTRL_OK) ctrl_pref_set_free(train), ctrl_pref_set_free(eval);
    return st;
}

void ctrl_pref_set_free(ctrl_pref_set *s) {
    for (int i = 0; i < s->n; i++) pref_row_free(&s->rows[i]);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

void ctrl_pref_set_describe(const ctrl_pref_set *s, const char *what) {
    long tokens = 0;
    int desirable = 0;
    for (int i = 0; i < s->n; i++) {
        const ctrl_pref_row *r = &s->rows[i];
        tokens += s->paired ? 2L * r->n_prompt + r->n_chosen + r->n_rejected : r->n_prompt + r->n_chosen;
        desirable += r->label != 0;
    }
    char rows[96];
    if (s->paired)
        snprintf(rows, sizeof rows, "%d pairs", s->n);
    else
        snprintf(rows, sizeof rows, "%d completions (%d desirable, %d undesirable)", s->n, desirable,
                 s->n - desirable);
    CTRL_INFO(
        "%s: %s preference data, %s%s, %ld tokens before max_length = %d (%s); %ld malformed rows skipped, "
        "%ld dropped over max_length, %ld cut by max_prompt_length / max_completion_length; %s%s",
        what, task_name(s->task), rows, s->has_margin ? " with margins" : "", tokens, s->max_length,
        s->keep_end ? "keep_end" : "keep_start", s->skipped_bad, s->dropped, s->truncated,
        s->padded ? "padded batches" : "padding-free batches", s->has_kl ? ", KL sequences" : "");
}
