/* TRL 1.16's preparation of one preference row (trl/data_utils.py extract_prompt; the
 * _prepare_dataset / tokenize_fn of dpo_trainer.py, kto_trainer.py and reward_trainer.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "template/chat.h"
#include "train/pref_format.h"
#include "train/sft_format.h"

struct pref_format {
    const ctrl_tokenizer *tok;
    ctrl_pref_task task;
    ctrl_template *tpl; /* compiled on the first conversational row */
    char *template_path;
    const char *prompt_field, *completion_field;
    const char *eos; /* EOS token text, NULL when the tokenizer has none */
};

ctrl_status pref_format_create(const ctrl_tokenizer *tok, const ctrl_config *cfg, ctrl_pref_task task,
                               pref_format **out) {
    pref_format *f = calloc(1, sizeof *f);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const char *path = s->data.chat_template_path;
    if (!f || (path && !(f->template_path = strdup(path)))) {
        free(f);
        return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    }
    f->tok = tok, f->task = task;
    f->prompt_field = s->data.prompt_field ? s->data.prompt_field : "prompt";
    f->completion_field = s->data.completion_field ? s->data.completion_field : "completion";
    const int32_t eos = ctrl_tokenizer_eos_id(tok);
    f->eos = eos >= 0 ? ctrl_tokenizer_id_to_token(tok, eos) : NULL;
    *out = f;
    return CTRL_OK;
}

void pref_format_free(pref_format *f) {
    if (!f) return;
    ctrl_template_free(f->tpl);
    free(f->template_path);
    free(f);
}

void pref_row_free(ctrl_pref_row *r) {
    free(r->prompt), free(r->chosen), free(r->rejected);
    memset(r, 0, sizeof *r);
}

/* --- extract_prompt: the shared prefix of chosen and rejected, by characters or by messages --- */

/* The elements compared: a string's code points (off[i] is code point i's byte offset, off[n] the
 * length) or a list's items. */
typedef struct seq_view {
    const cJSON *v;
    int n;
    size_t *off;
} seq_view;

static int view_open(const cJSON *v, seq_view *s) {
    *s = (seq_view){.v = v};
    if (cJSON_IsArray(v)) return s->n = cJSON_GetArraySize(v), 1;
    const char *t = v->valuestring;
    const size_t len = strlen(t);
    if (!(s->off = malloc(sizeof(size_t) * (len + 1)))) return 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)t[i] & 0xC0) != 0x80) s->off[s->n++] = i; /* not a continuation byte */
    s->off[s->n] = len;
    return 1;
}

static int view_same(const seq_view *a, const seq_view *b, int i) {
    if (!a->off) return cJSON_Compare(cJSON_GetArrayItem(a->v, i), cJSON_GetArrayItem(b->v, i), 1);
    const size_t la = a->off[i + 1] - a->off[i], lb = b->off[i + 1] - b->off[i];
    return la == lb && !memcmp(a->v->valuestring + a->off[i], b->v->valuestring + b->off[i], la);
}

static int view_is_space(const seq_view *a, int i) {
    if (!a->off) {
        const cJSON *e = cJSON_GetArrayItem(a->v, i);
        return cJSON_IsString(e) && !strcmp(e->valuestring, " ");
    }
    return a->off[i + 1] - a->off[i] == 1 && a->v->valuestring[a->off[i]] == ' ';
}

/* Python's v[from:] / v[:to] bound for an index that may be -1. */
static int py_bound(int idx, int n) { return idx < 0 ? (n + idx < 0 ? 0 : n + idx) : idx > n ? n : idx; }

/* v[from:to] as a new value of v's kind. */
static cJSON *view_slice(const seq_view *s, int from, int to) {
    if (!s->off) {
        cJSON *a = cJSON_CreateArray();
        for (int i = from; a && i < to; i++)
            cJSON_AddItemToArray(a, cJSON_Duplicate(cJSON_GetArrayItem(s->v, i), 1));
        return a;
    }
    const size_t b0 = s->off[from], b1 = s->off[to];
    char *t = malloc(b1 - b0 + 1);
    if (!t) return NULL;
    memcpy(t, s->v->valuestring + b0, b1 - b0);
    t[b1 - b0] = 0;
    cJSON *v = cJSON_CreateString(t);
    free(t);
    return v;
}

/* TRL's extract_prompt, Python's quirks included: the loop's index where the two first differ,
 * moved back over a space before it (chosen[idx - 1], which for idx = 0 is chosen's last element);
 * when neither differs within the shorter, the index left by the loop is its last element's. */
static ctrl_status extract_prompt(cJSON *row, const char *prompt_field, const char **why) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(row, "chosen"),
          *r = cJSON_GetObjectItemCaseSensitive(row, "rejected");
    const int strings = cJSON_IsString(c) && cJSON_IsString(r);
    if (!strings && !(ctrl_row_messages_ok(c) && ctrl_row_messages_ok(r))) {
        *why = "implicit prompt (no prompt column): columns \"chosen\" and \"rejected\" must both be strings "
               "or both be lists of messages with a \"role\"";
        return CTRL_OK;
    }
    seq_view a, b;
    if (!view_open(c, &a) || !view_open(r, &b)) {
        free(a.off);
        return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    }
    const int n = a.n < b.n ? a.n : b.n;
    int idx = 0, differ = 0;
    for (idx = 0; idx < n; idx++)
        if (!view_same(&a, &b, idx)) {
            differ = 1;
            break;
        }
    ctrl_status st = CTRL_OK;
    if (!differ && n == 0) {
        *why = "implicit prompt (no prompt column): columns \"chosen\" and \"rejected\" must not be empty";
        goto done;
    }
    if (!differ)
        idx = n - 1;
    else if (view_is_space(&a, idx > 0 ? idx - 1 : a.n - 1))
        idx--;
    cJSON *prompt = view_slice(&a, 0, py_bound(idx, a.n));
    cJSON *chosen = view_slice(&a, py_bound(idx, a.n), a.n),
          *rejected = view_slice(&b, py_bound(idx, b.n), b.n);
    if (!prompt || !chosen || !rejected) {
        cJSON_Delete(prompt), cJSON_Delete(chosen), cJSON_Delete(rejected);
        st = ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
        goto done;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(row, prompt_field);
    cJSON_AddItemToObject(row, prompt_field, prompt);
    cJSON_ReplaceItemInObjectCaseSensitive(row, "chosen", chosen);
    cJSON_ReplaceItemInObjectCaseSensitive(row, "rejected", rejected);
done:
    free(a.off), free(b.off);
    return st;
}

/* --- tokenization --- */

static ctrl_status chat_template(pref_format *f) {
    return f->tpl ? CTRL_OK : ctrl_row_chat_template(f->tok, f->template_path, &f->tpl);
}

/* A prompt alone: tokenizer(prompt) (special tokens added), or the chat template with the
 * generation prompt. */
static ctrl_status encode_prompt(pref_format *f, const cJSON *row, const cJSON *prompt, int32_t **ids,
                                 size_t *n) {
    if (cJSON_IsString(prompt))
        return ctrl_tokenizer_encode(f->tok, prompt->valuestring, strlen(prompt->valuestring), 1, ids, n);
    ctrl_status st = chat_template(f);
    if (st != CTRL_OK) return st;
    cJSON *vars = ctrl_row_chat_vars(f->tok, row, prompt, 1);
    st = vars ? ctrl_chat_encode(f->tok, f->tpl, vars, ids, n, NULL)
              : ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    cJSON_Delete(vars);
    return st;
}

/* prompt (may be NULL) + completion: strings with the EOS text appended to the completion unless
 * it ends with it, or the messages of both through the template without the generation prompt. */
static ctrl_status encode_full(pref_format *f, const cJSON *row, const cJSON *prompt, const cJSON *completion,
                               int32_t **ids, size_t *n) {
    if (cJSON_IsString(completion)) {
        const char *p = prompt ? prompt->valuestring : "", *c = completion->valuestring;
        const size_t lp = strlen(p), lc = strlen(c), le = f->eos ? strlen(f->eos) : 0;
        char *s = malloc(lp + lc + le + 1);
        if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory for a row of %zu bytes", lp + lc);
        memcpy(s, p, lp), memcpy(s + lp, c, lc);
        size_t len = lp + lc;
        if (f->eos && !(lc >= le && !memcmp(c + lc - le, f->eos, le))) memcpy(s + len, f->eos, le), len += le;
        ctrl_status st = ctrl_tokenizer_encode(f->tok, s, len, 1, ids, n);
        free(s);
        return st;
    }
    ctrl_status st = chat_template(f);
    if (st != CTRL_OK) return st;
    cJSON *vars = ctrl_row_chat_vars(f->tok, row, prompt ? prompt : completion, 0);
    if (!vars) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    if (prompt) {
        cJSON *all = cJSON_GetObjectItemCaseSensitive(vars, "messages");
        const cJSON *m;
        cJSON_ArrayForEach(m, completion) cJSON_AddItemToArray(all, cJSON_Duplicate(m, 1));
    }
    st = ctrl_chat_encode(f->tok, f->tpl, vars, ids, n, NULL);
    cJSON_Delete(vars);
    return st;
}

/* dst = src[from..n) as a malloc'd copy. */
static ctrl_status take(const int32_t *src, size_t from, size_t n, int32_t **dst, int *len) {
    const size_t k = n > from ? n - from : 0;
    if (!(*dst = malloc(sizeof(int32_t) * (k ? k : 1))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    memcpy(*dst, src + from, sizeof(int32_t) * k);
    *len = (int)k;
    return CTRL_OK;
}

/* A pre-tokenized column (the reward trainer's chosen_ids / rejected_ids): 0, or 1 with the ids. */
static int token_column(const pref_format *f, const cJSON *v, int32_t **ids, int *n) {
    if (!cJSON_IsArray(v)) return 0;
    const int k = cJSON_GetArraySize(v);
    if (!(*ids = malloc(sizeof(int32_t) * (size_t)(k ? k : 1)))) return -1;
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= ctrl_tokenizer_vocab_size(f->tok) ||
            e->valuedouble != (double)(int32_t)e->valuedouble) {
            free(*ids), *ids = NULL;
            return 0;
        }
        (*ids)[i++] = (int32_t)e->valuedouble;
    }
    *n = k;
    return 1;
}

static ctrl_status pretokenized(pref_format *f, const cJSON *row, ctrl_pref_row *out, const char **why) {
    const char *names[2][2] = {{"chosen_ids", "rejected_ids"}, {"chosen_input_ids", "rejected_input_ids"}};
    const int legacy = !cJSON_HasObjectItem(row, "chosen_ids");
    int rc = token_column(f, cJSON_GetObjectItemCaseSensitive(row, names[legacy][0]), &out->chosen,
                          &out->n_chosen);
    if (rc > 0)
        rc = token_column(f, cJSON_GetObjectItemCaseSensitive(row, names[legacy][1]), &out->rejected,
                          &out->n_rejected);
    if (rc < 0) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    if (rc == 0) {
        pref_row_free(out);
        *why =
            legacy
                ? "columns \"chosen_input_ids\" and \"rejected_input_ids\" must be lists of token ids of "
                  "this "
                  "tokenizer"
                : "columns \"chosen_ids\" and \"rejected_ids\" must be lists of token ids of this tokenizer";
    }
    return CTRL_OK;
}

/* The row's columns have one kind: all strings or all message lists. */
static const char *kinds_match(const cJSON *const *cols, const char *const *names, int n, char *buf,
                               size_t cap) {
    const int conv = cJSON_IsArray(cols[0]);
    for (int i = 0; i < n; i++) {
        if (!cols[i]) return snprintf(buf, cap, "column \"%s\" is missing", names[i]), buf;
        if (conv ? !ctrl_row_messages_ok(cols[i]) : !cJSON_IsString(cols[i])) {
            if (conv || cJSON_IsArray(cols[i]))
                snprintf(buf, cap, "column \"%s\" must be %s, as \"%s\" is", names[i],
                         conv ? "a non-empty list of messages with a \"role\"" : "a string", names[0]);
            else
                snprintf(buf, cap, "column \"%s\" must be a string or a list of messages", names[i]);
            return buf;
        }
    }
    return NULL;
}

/* The row's ids for f->task (its columns checked: cols[0..nc) are the prompt if any, then chosen and
 * rejected or the completion). */
static ctrl_status tokenize_row(pref_format *f, const cJSON *row, const cJSON *prompt,
                                const cJSON *const *cols, int nc, int paired, ctrl_pref_row out[2],
                                int *n_out) {
    ctrl_status st;
    if (f->task == CTRL_PREF_REWARD) { /* whole sequences: prompt + chosen, prompt + rejected */
        size_t n = 0, m = 0;
        int32_t *c = NULL, *r = NULL;
        st = encode_full(f, row, prompt, cols[nc - 2], &c, &n);
        if (st == CTRL_OK) st = encode_full(f, row, prompt, cols[nc - 1], &r, &m);
        out[0].chosen = c, out[0].rejected = r, out[0].n_chosen = (int)n, out[0].n_rejected = (int)m;
        if (st != CTRL_OK) return pref_row_free(&out[0]), st;
        *n_out = 1;
        return CTRL_OK;
    }
    /* DPO, KTO: the prompt, then each completion after it; the completion starts where the
     * tokenized prompt and prompt + completion diverge (for a DPO pair, the earlier of the two). */
    int32_t *p = NULL, *full[2] = {NULL, NULL};
    size_t np = 0, nf[2] = {0, 0}, split[2];
    const int halves = paired ? 2 : 1;
    st = encode_prompt(f, row, prompt, &p, &np);
    for (int h = 0; h < halves && st == CTRL_OK; h++) {
        st = encode_full(f, row, prompt, cols[1 + h], &full[h], &nf[h]);
        if (st == CTRL_OK) split[h] = ctrl_common_prefix(p, np, full[h], nf[h]);
    }
    if (st == CTRL_OK && f->task == CTRL_PREF_DPO) {
        const size_t k = split[0] < split[1] ? split[0] : split[1];
        st = take(p, 0, k, &out[0].prompt, &out[0].n_prompt);
        if (st == CTRL_OK) st = take(full[0], k, nf[0], &out[0].chosen, &out[0].n_chosen);
        if (st == CTRL_OK) st = take(full[1], k, nf[1], &out[0].rejected, &out[0].n_rejected);
        *n_out = 1;
    } else if (st == CTRL_OK) { /* KTO: a paired row is unpaired into chosen (label 1), rejected (0) */
        for (int h = 0; h < halves && st == CTRL_OK; h++) {
            out[h].kl_row = -1, out[h].margin = out[0].margin;
            out[h].label = paired ? (float)(h == 0) : out[0].label;
            st = take(p, 0, split[h], &out[h].prompt, &out[h].n_prompt);
            if (st == CTRL_OK) st = take(full[h], split[h], nf[h], &out[h].chosen, &out[h].n_chosen);
        }
        *n_out = halves;
    }
    free(p), free(full[0]), free(full[1]);
    if (st != CTRL_OK) {
        pref_row_free(&out[0]), pref_row_free(&out[1]);
        *n_out = 0;
    }
    return st;
}

ctrl_status pref_format_row(pref_format *f, cJSON *row, ctrl_pref_row out[2], int *n_out, const char **why,
                            char *why_buf, size_t why_cap) {
    memset(out, 0, 2 * sizeof *out);
    *n_out = 0, *why = NULL;
    out[0].kl_row = out[1].kl_row = -1;
    if (!cJSON_IsObject(row)) return *why = "not a JSON object", CTRL_OK;
    const cJSON *margin = cJSON_GetObjectItemCaseSensitive(row, "margin");
    out[0].margin = NAN; /* absent */
    if (margin && !cJSON_IsNull(margin)) {
        if (!cJSON_IsNumber(margin)) return *why = "column \"margin\" must be a number", CTRL_OK;
        out[0].margin = (float)margin->valuedouble;
    }
    ctrl_status st;
    if (f->task == CTRL_PREF_REWARD &&
        (cJSON_HasObjectItem(row, "chosen_ids") || cJSON_HasObjectItem(row, "chosen_input_ids"))) {
        if ((st = pretokenized(f, row, &out[0], why)) == CTRL_OK && !*why) *n_out = 1;
        return st;
    }
    const int paired = cJSON_HasObjectItem(row, "chosen") || cJSON_HasObjectItem(row, "rejected");
    if (!paired && f->task != CTRL_PREF_KTO)
        return *why = "a preference row needs columns \"chosen\" and \"rejected\"", CTRL_OK;
    if (paired && !cJSON_HasObjectItem(row, f->prompt_field) && f->task != CTRL_PREF_REWARD) {
        if ((st = extract_prompt(row, f->prompt_field, why)) != CTRL_OK || *why) return st;
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(row, f->prompt_field);
    const cJSON *cols[3];
    const char *names[3];
    int nc = 0;
    if (prompt || f->task != CTRL_PREF_REWARD) cols[nc] = prompt, names[nc++] = f->prompt_field;
    if (paired) {
        cols[nc] = cJSON_GetObjectItemCaseSensitive(row, "chosen"), names[nc++] = "chosen";
        cols[nc] = cJSON_GetObjectItemCaseSensitive(row, "rejected"), names[nc++] = "rejected";
    } else {
        cols[nc] = cJSON_GetObjectItemCaseSensitive(row, f->completion_field),
        names[nc++] = f->completion_field;
        const cJSON *label = cJSON_GetObjectItemCaseSensitive(row, "label");
        if (cJSON_IsBool(label))
            out[0].label = cJSON_IsTrue(label);
        else if (cJSON_IsNumber(label) && (label->valuedouble == 0 || label->valuedouble == 1))
            out[0].label = (float)label->valuedouble;
        else
            return *why = label ? "column \"label\" must be true or false" : "column \"label\" is missing",
                   CTRL_OK;
    }
    if ((*why = kinds_match(cols, names, nc, why_buf, why_cap))) return CTRL_OK;
    /* the template is the run's: failing to load it stops the run; failing on a row is the row's */
    if (cJSON_IsArray(cols[0]) && (st = chat_template(f)) != CTRL_OK) return st;
    st = tokenize_row(f, row, prompt, cols, nc, paired, out, n_out);
    if (st != CTRL_OK && st != CTRL_ERR_NOMEM) {
        snprintf(why_buf, why_cap, "the chat template or the tokenizer failed on this row: %s",
                 ctrl_error_message());
        *why = why_buf;
        return CTRL_OK;
    }
    return st;
}
