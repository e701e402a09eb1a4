/* SFT data: rows streamed from JSONL or JSON array files, tokenized into examples with TRL's
 * semantics (train/sft_format.c), truncated, and packed into flat batches. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/row_reader.h"
#include "train/sft_format.h"
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

ctrl_status ctrl_dataset_load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                  ctrl_dataset *out) {
    memset(out, 0, sizeof *out);
    const int max_len = (int)ctrl_config_get_int(cfg, "data", "max_length", 1024);
    const char *trunc = ctrl_config_get_string(cfg, "data", "truncation_mode");
    const int keep_end = trunc && !strcmp(trunc, "keep_end");
    const int skip_bad = ctrl_config_get_bool(cfg, "data", "skip_bad_rows", false);
    ctrl_row_reader *rows;
    ctrl_status st = ctrl_row_reader_open(path, &rows);
    if (st != CTRL_OK) return st;
    ctrl_sft_format *fmt;
    if ((st = ctrl_sft_format_create(tok, cfg, &fmt)) != CTRL_OK) {
        ctrl_row_reader_close(rows);
        return st;
    }
    cJSON *o;
    long lineno;
    int more;
    while (st == CTRL_OK && (more = ctrl_row_reader_next(rows, &o, &lineno)) != 0) {
        if (more < 0) {
            st = CTRL_ERR_FORMAT;
            break;
        }
        int32_t *ids = NULL;
        uint8_t *trained = NULL;
        int n = 0;
        const char *why = o ? NULL : "not valid JSON";
        if (o) st = ctrl_sft_format_row(fmt, o, &ids, &trained, &n, &why);
        cJSON_Delete(o);
        if (st != CTRL_OK) { /* name the row that hit it */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ctrl_error_message());
            ctrl_error_set(st, "%s:%ld: %s", path, lineno, msg);
            break;
        }
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
        /* Dropped when no token is trained, as TRL drops fully masked examples (a lone trained
         * first token is kept although nothing predicts it). */
        int any = 0;
        for (int i = 0; i < n; i++) any |= trained[off + i];
        if (any)
            st = add_example(out, ids + off, trained + off, n);
        else
            out->dropped_empty++;
        free(ids);
        free(trained);
    }
    ctrl_sft_format_free(fmt);
    ctrl_row_reader_close(rows);
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
