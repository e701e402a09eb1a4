/* SFT data: rows streamed from JSONL or JSON array files, tokenized into examples with TRL's
 * semantics (train/sft_format.c), truncated, and packed into flat batches. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "train/row_reader.h"
#include "train/sft_format.h"
#include "train/train.h"

static ctrl_status add_example(ctrl_dataset *d, const int32_t *ids, const uint8_t *trained, int n) {
    if ((d->n & (d->n - 1)) == 0) { /* grow at powers of two */
        ctrl_example *e = realloc(d->ex, sizeof *e * (size_t)(d->n ? 2 * d->n : 1));
        if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "dataset: out of memory");
        d->ex = e;
    }
    int32_t *e_ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    uint8_t *e_trained = malloc((size_t)(n ? n : 1));
    if (!e_ids || !e_trained) {
        free(e_ids), free(e_trained);
        return ctrl_error_set(CTRL_ERR_NOMEM, "dataset: out of memory for an example of %d tokens", n);
    }
    ctrl_example *e = &d->ex[d->n++];
    *e = (ctrl_example){.ids = e_ids, .trained = e_trained, .len = n};
    memcpy(e->ids, ids, sizeof(int32_t) * (size_t)n);
    memcpy(e->trained, trained, (size_t)n);
    return CTRL_OK;
}

/* Truncates to max_length as truncation_mode says and keeps the example only if a token is still
 * trained (TRL drops fully masked examples; a lone trained first token is kept although nothing
 * predicts it). */
static ctrl_status fit_example(ctrl_dataset *d, const int32_t *ids, const uint8_t *trained, int n,
                               int max_len, int keep_end) {
    int off = 0;
    if (n > max_len) {
        off = keep_end ? n - max_len : 0;
        n = max_len;
        d->truncated++;
    }
    int any = 0;
    for (int i = 0; i < n; i++) any |= trained[off + i];
    if (!any) {
        d->dropped_empty++;
        return CTRL_OK;
    }
    return add_example(d, ids + off, trained + off, n);
}

static int keep_end_mode(const ctrl_config *cfg) {
    const char *trunc = ctrl_config_settings(cfg)->data.truncation_mode;
    return trunc && !strcmp(trunc, "keep_end");
}

/* raw: examples as tokenized, neither truncated nor dropped, as TRL leaves a set it packs (bfd
 * truncates each sequence to the pack length itself, bfd_split and wrapped keep every token). */
static ctrl_status load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg, int raw,
                            ctrl_dataset *out) {
    memset(out, 0, sizeof *out);
    const int max_len = ctrl_config_settings(cfg)->data.max_length;
    const int keep_end = keep_end_mode(cfg);
    const int skip_bad = ctrl_config_settings(cfg)->data.skip_bad_rows;
    ctrl_row_reader *rows;
    ctrl_status st = ctrl_row_reader_open_data(path, cfg, &rows);
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
            ctrl_error_wrap(st, "%s:%ld", ctrl_row_reader_file(rows), lineno);
            break;
        }
        if (why) {
            if (!skip_bad) {
                st = ctrl_error_set(CTRL_ERR_FORMAT, "%s:%ld: %s", ctrl_row_reader_file(rows), lineno, why);
                break;
            }
            out->skipped_bad++;
            continue;
        }
        st = raw ? add_example(out, ids, trained, n) : fit_example(out, ids, trained, n, max_len, keep_end);
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

ctrl_status ctrl_dataset_load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                  ctrl_dataset *out) {
    return load_sft(path, tok, cfg, ctrl_config_settings(cfg)->data.packing, out);
}

/* A raw set that is not packed after all (a held-out share): truncated and filtered as if loaded so. */
static ctrl_status fit_all(ctrl_dataset *d, const ctrl_config *cfg, const char *what) {
    ctrl_dataset out = {
        .skipped_bad = d->skipped_bad, .dropped_empty = d->dropped_empty, .truncated = d->truncated};
    const int max_len = ctrl_config_settings(cfg)->data.max_length, keep_end = keep_end_mode(cfg);
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < d->n && st == CTRL_OK; i++)
        st = fit_example(&out, d->ex[i].ids, d->ex[i].trained, d->ex[i].len, max_len, keep_end);
    ctrl_dataset_free(d);
    *d = out;
    if (st == CTRL_OK && d->n == 0)
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: no example with a trained token after truncation", what);
    return st;
}

void ctrl_dataset_free(ctrl_dataset *d) {
    for (int i = 0; i < d->n; i++) free(d->ex[i].ids), free(d->ex[i].trained), free(d->ex[i].seg);
    free(d->ex);
    memset(d, 0, sizeof *d);
}

/* The seeded hold-out of [data] eval_fraction over n rows: to_eval[i] = 1 for the round(n * fraction)
 * (at least 1) rows held out, *n_eval their count; CTRL_ERR_CONFIG when none would be left to train. */
static ctrl_status hold_out_pick(int n, double fraction, uint64_t seed, uint8_t *to_eval, int *n_eval_out) {
    int n_eval = (int)(n * fraction + 0.5);
    if (n_eval < 1) n_eval = 1;
    if (n_eval >= n)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[data] eval_fraction = %g leaves no training example (%d examples)", fraction,
                              n);
    int *perm = malloc(sizeof(int) * (size_t)n);
    if (!perm) return ctrl_error_set(CTRL_ERR_NOMEM, "[data] eval_fraction: out of memory");
    for (int i = 0; i < n; i++) perm[i] = i;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (int i = n - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memset(to_eval, 0, (size_t)n);
    for (int k = 0; k < n_eval; k++) to_eval[perm[k]] = 1;
    free(perm);
    *n_eval_out = n_eval;
    return CTRL_OK;
}

ctrl_status ctrl_hold_out_split(void *rows, size_t size, int *n, double fraction, uint64_t seed, void **held,
                                int *n_held) {
    *held = NULL, *n_held = 0;
    uint8_t *to_eval = malloc((size_t)*n + 1);
    if (!to_eval) return ctrl_error_set(CTRL_ERR_NOMEM, "[data] eval_fraction: out of memory");
    int n_eval = 0;
    ctrl_status st = hold_out_pick(*n, fraction, seed, to_eval, &n_eval);
    char *out = st == CTRL_OK ? malloc(size * (size_t)n_eval) : NULL;
    if (st == CTRL_OK && !out) st = ctrl_error_set(CTRL_ERR_NOMEM, "[data] eval_fraction: out of memory");
    if (st != CTRL_OK) {
        free(to_eval);
        return st;
    }
    char *r = rows;
    int kept = 0, k = 0;
    for (int i = 0; i < *n; i++)
        memmove(to_eval[i] ? out + size * (size_t)k++ : r + size * (size_t)kept++, r + size * (size_t)i,
                size);
    free(to_eval);
    *n = kept, *held = out, *n_held = k;
    return CTRL_OK;
}

/* Moves a seeded random `fraction` of `train`'s examples to `eval` (both keep file order). */
static ctrl_status hold_out(ctrl_dataset *train, ctrl_dataset *eval, double fraction, uint64_t seed) {
    void *held;
    int n_held;
    ctrl_status st =
        ctrl_hold_out_split(train->ex, sizeof *train->ex, &train->n, fraction, seed, &held, &n_held);
    if (st != CTRL_OK) return st;
    memset(eval, 0, sizeof *eval);
    eval->ex = held, eval->n = n_held;
    return CTRL_OK;
}

static ctrl_status pack_and_report(ctrl_dataset *d, int max_len, const char *strategy, const char *what) {
    long tokens_in = 0;
    for (int i = 0; i < d->n; i++) tokens_in += d->ex[i].len;
    ctrl_status st = ctrl_dataset_pack(d, max_len, strategy);
    if (st != CTRL_OK) return st;
    long kept = 0;
    for (int i = 0; i < d->n; i++) kept += d->ex[i].len;
    CTRL_INFO("%s: %d examples packed (%s) into %d rows of %d, fill rate %.3f, %ld of %ld tokens kept", what,
              d->packed_from, strategy, d->n, max_len, ctrl_dataset_fill_rate(d, max_len), kept, tokens_in);
    return CTRL_OK;
}

ctrl_status ctrl_datasets_load(const ctrl_config *cfg, const ctrl_tokenizer *tok, ctrl_dataset *train,
                               ctrl_dataset *eval) {
    memset(eval, 0, sizeof *eval);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const char *train_file = s->data.train_file;
    const char *eval_file = s->data.eval_file;
    const double fraction = s->data.eval_fraction;
    const int packing = s->data.packing;
    /* TRL's eval_packing = None: the eval set is packed as the train set is */
    const int eval_packing = s->data.eval_packing >= 0 ? s->data.eval_packing : packing;
    const int max_len = s->data.max_length;
    const char *strategy = s->data.packing_strategy;
    if (!strategy) strategy = "bfd";
    if (!train_file) return ctrl_error_set(CTRL_ERR_CONFIG, "config: [data] train_file is required to train");
    /* A held-out share is taken from the rows as tokenized; each set is then truncated (unpacked)
     * or packed on its own, as TRL prepares its train and eval sets. */
    const int hold = !eval_file && fraction > 0;
    ctrl_status st = load_sft(train_file, tok, cfg, packing || hold, train);
    if (st == CTRL_OK && eval_file) st = load_sft(eval_file, tok, cfg, eval_packing, eval);
    if (st == CTRL_OK && hold) {
        st = hold_out(train, eval, fraction, s->run.seed);
        if (st == CTRL_OK && !packing) st = fit_all(train, cfg, train_file);
        if (st == CTRL_OK && !eval_packing) st = fit_all(eval, cfg, "[data] eval_fraction hold-out");
    }
    if (st == CTRL_OK && packing) st = pack_and_report(train, max_len, strategy, "train");
    if (st == CTRL_OK && eval_packing && eval->n) st = pack_and_report(eval, max_len, strategy, "eval");
    if (st != CTRL_OK) {
        ctrl_dataset_free(train), ctrl_dataset_free(eval);
        return st;
    }
    int32_t pad = ctrl_tokenizer_pad_id(tok);
    if (pad < 0) pad = ctrl_tokenizer_eos_id(tok); /* TRL pads with eos when the tokenizer has no pad */
    /* TRL forces padding-free batches with bfd packing (padded rows would lose the sequence
     * boundaries inside a row); its one collator serves the train and the eval set. */
    const int padding_free = s->data.padding_free || (packing && strcmp(strategy, "wrapped") != 0);
    for (ctrl_dataset *d = train; d; d = d == train ? eval : NULL) {
        d->padded = !padding_free;
        d->pad_multiple = s->data.pad_to_multiple_of;
        d->pad_id = pad < 0 ? 0 : pad;
    }
    return CTRL_OK;
}

long ctrl_batch_build(const ctrl_dataset *d, const int *idx, int n, ctrl_batch *b, long *tokens) {
    const int mult = d->pad_multiple > 1 ? d->pad_multiple : 1;
    int row = 0, T = 0, B = 0;
    for (int i = 0; i < n; i++) {
        const ctrl_example *e = &d->ex[idx[i]];
        row = e->len > row ? e->len : row;
        T += e->len;
        B += e->n_seg ? e->n_seg : 1;
    }
    row = (row + mult - 1) / mult * mult;
    int pads = 0; /* pad segments */
    if (d->padded) {
        for (int i = 0; i < n; i++) pads += d->ex[idx[i]].len < row;
        T = row * n;
    } else if (T % mult) {
        pads = 1;
        T = (T + mult - 1) / mult * mult;
    }
    B += pads;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)T), *cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    memset(b, 0, sizeof *b);
    if (!tok || !pos || !tg || !cu) {
        free(tok), free(pos), free(tg), free(cu);
        ctrl_error_set(CTRL_ERR_NOMEM, "batch: out of memory for %d tokens", T);
        return -1;
    }
    long trained = 0, real = 0;
    int t = 0, s = 0;
    cu[0] = 0;
    for (int i = 0; i < n; i++) {
        const ctrl_example *e = &d->ex[idx[i]];
        const int n_seg = e->n_seg ? e->n_seg : 1;
        for (int g = 0, off = 0; g < n_seg; g++) {
            const int len = e->n_seg ? e->seg[g] : e->len;
            for (int k = 0; k < len; k++, t++) {
                tok[t] = e->ids[off + k];
                pos[t] = k;
                /* no token is predicted across a sequence boundary */
                tg[t] = k + 1 < len && e->trained[off + k + 1] ? e->ids[off + k + 1] : -100;
                trained += tg[t] >= 0;
            }
            off += len, real += len;
            cu[++s] = t;
        }
        const int pad = d->padded ? row - e->len : i == n - 1 ? T - t : 0;
        if (pad > 0) { /* a masked segment of its own: attends to nothing real, predicts nothing */
            for (int k = 0; k < pad; k++, t++) tok[t] = d->pad_id, pos[t] = k, tg[t] = -100;
            cu[++s] = t;
        }
    }
    *b = (ctrl_batch){.T = T, .B = B, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    /* TRL's num_tokens: the attention mask's sum for padded rows, the whole flat row (padding to
     * pad_to_multiple_of included) for padding-free batches */
    if (tokens) *tokens = d->padded ? real : T;
    return trained;
}

void ctrl_batch_free(ctrl_batch *b) {
    free((void *)b->tokens), free((void *)b->positions), free((void *)b->targets),
        free((void *)b->cu_seqlens);
    memset(b, 0, sizeof *b);
}
