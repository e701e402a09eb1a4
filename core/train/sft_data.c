/* SFT data: JSONL rows in TRL's plain formats, streamed line by line, tokenized into examples. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

static ctrl_status add_example(ctrl_dataset *d, const int32_t *ids, const uint8_t *trained, int n) {
    if ((d->n & (d->n - 1)) == 0) { /* grow at powers of two */
        ctrl_example *e = realloc(d->ex, sizeof *e * (size_t)(d->n ? 2 * d->n : 1));
        if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "dataset: out of memory");
        d->ex = e;
    }
    ctrl_example *e = &d->ex[d->n++];
    e->ids = malloc(sizeof(int32_t) * (size_t)n);
    e->trained = malloc((size_t)n);
    e->len = n;
    memcpy(e->ids, ids, sizeof(int32_t) * (size_t)n);
    memcpy(e->trained, trained, (size_t)n);
    return CTRL_OK;
}

/* Tokenizes one row into ids + trained flags; *why says what is wrong with a malformed row. */
static ctrl_status row_example(const cJSON *o, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                               int32_t **ids, uint8_t **trained, int *n, const char **why) {
    const char *text_field = ctrl_config_get_string(cfg, "data", "dataset_text_field");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, text_field ? text_field : "text");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(o, "completion");
    const char *col = ctrl_config_get_string(cfg, "data", "completion_only_loss");
    int32_t eos = ctrl_tokenizer_eos_id(tok);
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ctrl_status st;
    *why = NULL;
    if (cJSON_IsString(prompt) && cJSON_IsString(completion)) {
        /* As TRL: tokenize prompt and prompt + completion; the first len(prompt ids) tokens are
         * the prompt (so the junction tokenizes as in the full text). */
        size_t lp = strlen(prompt->valuestring), lc = strlen(completion->valuestring);
        char *full = malloc(lp + lc + 1);
        memcpy(full, prompt->valuestring, lp);
        memcpy(full + lp, completion->valuestring, lc + 1);
        st = ctrl_tokenizer_encode(tok, prompt->valuestring, lp, 1, &a, &na);
        if (st == CTRL_OK) st = ctrl_tokenizer_encode(tok, full, lp + lc, 1, &b, &nb);
        free(full);
        if (st != CTRL_OK) {
            free(a);
            return st;
        }
        /* completion_only_loss: auto = on for prompt-completion rows, as TRL */
        int completion_only = !col || strcmp(col, "false") != 0;
        *n = (int)nb + (eos >= 0);
        *ids = malloc(sizeof(int32_t) * (size_t)*n);
        *trained = malloc((size_t)*n);
        memcpy(*ids, b, sizeof(int32_t) * nb);
        for (int i = 0; i < *n; i++) (*trained)[i] = completion_only ? (size_t)i >= na : 1;
        if (eos >= 0) (*ids)[*n - 1] = eos;
    } else if (cJSON_IsString(text)) {
        if ((st = ctrl_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), 1, &a, &na)) !=
            CTRL_OK)
            return st;
        int add_eos = eos >= 0 && (na == 0 || a[na - 1] != eos);
        *n = (int)na + add_eos;
        *ids = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
        *trained = malloc((size_t)(*n ? *n : 1));
        memcpy(*ids, a, sizeof(int32_t) * na);
        if (add_eos) (*ids)[na] = eos;
        memset(*trained, 1, (size_t)*n);
    } else {
        *why = cJSON_IsObject(o)
                   ? "expected a string \"text\" field, or string \"prompt\" and \"completion\" fields"
                   : "not a JSON object";
        return CTRL_OK;
    }
    free(a);
    free(b);
    return CTRL_OK;
}

ctrl_status ctrl_dataset_load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                  ctrl_dataset *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    const int max_len = (int)ctrl_config_get_int(cfg, "data", "max_length", 1024);
    const char *trunc = ctrl_config_get_string(cfg, "data", "truncation_mode");
    const int keep_end = trunc && !strcmp(trunc, "keep_end");
    const int skip_bad = ctrl_config_get_bool(cfg, "data", "skip_bad_rows", false);
    size_t cap = 1 << 16;
    char *line = malloc(cap);
    long lineno = 0;
    ctrl_status st = CTRL_OK;
    while (st == CTRL_OK) {
        /* getline-like: rows may be longer than the buffer */
        size_t len = 0;
        line[0] = '\0';
        while (fgets(line + len, (int)(cap - len), f)) {
            len += strlen(line + len);
            if (len && line[len - 1] == '\n') break;
            cap *= 2;
            line = realloc(line, cap);
        }
        if (len == 0) break;
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        cJSON *o = cJSON_Parse(line);
        int32_t *ids = NULL;
        uint8_t *trained = NULL;
        int n = 0;
        const char *why = o ? NULL : "not valid JSON";
        if (o) st = row_example(o, tok, cfg, &ids, &trained, &n, &why);
        cJSON_Delete(o);
        if (st != CTRL_OK) break;
        if (why) {
            if (!skip_bad) {
                st = ctrl_error_set(CTRL_ERR_FORMAT, "%s:%ld: %s", path, lineno, why);
                break;
            }
            out->skipped_bad++;
            continue;
        }
        int off = 0;
        if (n > max_len) {
            off = keep_end ? n - max_len : 0;
            n = max_len;
            out->truncated++;
        }
        /* Trained targets are positions 1..n-1 whose token is trained. */
        int any = 0;
        for (int i = 1; i < n; i++) any |= trained[off + i];
        if (any)
            st = add_example(out, ids + off, trained + off, n);
        else
            out->dropped_empty++;
        free(ids);
        free(trained);
    }
    free(line);
    fclose(f);
    if (st != CTRL_OK) {
        ctrl_dataset_free(out);
        return st;
    }
    if (out->n == 0) return ctrl_error_set(CTRL_ERR_FORMAT, "%s: no example with a trained token", path);
    return CTRL_OK;
}

void ctrl_dataset_free(ctrl_dataset *d) {
    for (int i = 0; i < d->n; i++) free(d->ex[i].ids), free(d->ex[i].trained);
    free(d->ex);
    memset(d, 0, sizeof *d);
}

long ctrl_batch_build(const ctrl_dataset *d, const int *idx, int n, ctrl_batch *b) {
    int T = 0;
    for (int i = 0; i < n; i++) T += d->ex[idx[i]].len;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)T), *cu = malloc(sizeof(int32_t) * (size_t)(n + 1));
    long trained = 0;
    int t = 0;
    cu[0] = 0;
    for (int i = 0; i < n; i++) {
        const ctrl_example *e = &d->ex[idx[i]];
        for (int k = 0; k < e->len; k++, t++) {
            tok[t] = e->ids[k];
            pos[t] = k;
            /* no token is predicted across an example boundary */
            tg[t] = k + 1 < e->len && e->trained[k + 1] ? e->ids[k + 1] : -100;
            trained += tg[t] >= 0;
        }
        cu[i + 1] = t;
    }
    *b = (ctrl_batch){.T = T, .B = n, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    return trained;
}

void ctrl_batch_free(ctrl_batch *b) {
    free((void *)b->tokens), free((void *)b->positions), free((void *)b->targets),
        free((void *)b->cu_seqlens);
    memset(b, 0, sizeof *b);
}
