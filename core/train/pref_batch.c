/* Preference micro-batches (pref_data.h: ctrl_pref_batch): chosen then rejected sequences (or
 * KTO's completions then its KL sequences), max_length applied per sequence as TRL's collators do,
 * laid out padding-free or padded. */
#include <stdlib.h>
#include <string.h>

#include "train/pref_data.h"

/* Sequence k of the micro-batch: prompt part a[0..na), completion part b[0..nb), the set row, and
 * which of KTO's KL sequences it is. */
typedef struct seq_ref {
    const int32_t *a, *b;
    int na, nb;
    int row, kl;
} seq_ref;

static seq_ref seq_at(const ctrl_pref_set *s, const int *idx, int n, int k) {
    const int kl = !s->paired && k >= n, second = k >= n;
    const ctrl_pref_row *r = &s->rows[idx[second ? k - n : k]];
    seq_ref q = {.a = r->prompt, .na = r->n_prompt, .row = idx[second ? k - n : k], .kl = kl};
    if (s->paired) {
        q.b = second ? r->rejected : r->chosen, q.nb = second ? r->n_rejected : r->n_chosen;
    } else {
        const ctrl_pref_row *c = kl ? &s->rows[r->kl_row] : r;
        q.b = c->chosen, q.nb = c->n_chosen;
    }
    return q;
}

/* The window of prompt + completion that max_length keeps: [*off, *off + len). */
static int seq_window(const ctrl_pref_set *s, const seq_ref *q, int *off) {
    const int full = q->na + q->nb;
    const int len = s->max_length > 0 && full > s->max_length ? s->max_length : full;
    *off = s->keep_end ? full - len : 0;
    return len;
}

static int32_t seq_token(const seq_ref *q, int i) { return i < q->na ? q->a[i] : q->b[i - q->na]; }

static int round_up(int x, int m) { return m > 1 ? (x + m - 1) / m * m : x; }

void ctrl_pref_batch_free(ctrl_pref_batch *b) {
    free((void *)b->batch.tokens), free((void *)b->batch.positions), free((void *)b->batch.targets),
        free((void *)b->batch.cu_seqlens);
    free(b->seq_cu), free(b->seq_len), free(b->last), free(b->weight), free(b->n_tokens),
        free(b->n_completion);
    free(b->label), free(b->kl), free(b->margin), free(b->row);
    memset(b, 0, sizeof *b);
}

ctrl_status ctrl_pref_batch_build(const ctrl_pref_set *s, const int *idx, int n, ctrl_pref_batch *b) {
    memset(b, 0, sizeof *b);
    const int n_seq = s->paired || s->has_kl ? 2 * n : n;
    /* groups padded together: the pairs; KTO's completions and its KL sequences apart */
    const int n_groups = s->paired || !s->has_kl ? 1 : 2, per_group = n_seq / n_groups;
    int row_len[2] = {0, 0}, T = 0, pads = 0;
    for (int k = 0; k < n_seq; k++) {
        const seq_ref q = seq_at(s, idx, n, k);
        int off;
        const int len = seq_window(s, &q, &off), g = k / per_group;
        row_len[g] = len > row_len[g] ? len : row_len[g];
        T += len;
    }
    if (s->padded) {
        T = 0;
        for (int k = 0; k < n_seq; k++) {
            const seq_ref q = seq_at(s, idx, n, k);
            int off;
            const int g = k / per_group, row = round_up(row_len[g], s->pad_multiple);
            pads += seq_window(s, &q, &off) < row;
            T += row;
        }
    } else if (round_up(T, s->pad_multiple) > T) {
        pads = 1, T = round_up(T, s->pad_multiple);
    }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)T),
            *cu = malloc(sizeof(int32_t) * (size_t)(n_seq + pads + 1));
    b->seq_cu = malloc(sizeof(int32_t) * (size_t)(n_seq + 1));
    b->seq_len = malloc(sizeof(int) * (size_t)n_seq), b->last = malloc(sizeof(int) * (size_t)n_seq);
    b->weight = malloc(sizeof(float) * (size_t)T), b->n_tokens = malloc(sizeof(int) * (size_t)n_seq);
    b->n_completion = malloc(sizeof(int) * (size_t)n_seq);
    b->row = malloc(sizeof(int) * (size_t)n_seq);
    if (!s->paired) b->label = malloc(sizeof(float) * (size_t)n_seq);
    if (s->has_kl) b->kl = malloc((size_t)n_seq);
    if (s->has_margin) b->margin = malloc(sizeof(float) * (size_t)n);
    b->batch = (ctrl_batch){
        .T = T, .B = n_seq + pads, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    if (!tok || !pos || !tg || !cu || !b->seq_cu || !b->seq_len || !b->last || !b->weight || !b->n_tokens ||
        !b->n_completion || !b->row || (!s->paired && !b->label) || (s->has_kl && !b->kl) ||
        (s->has_margin && !b->margin)) {
        ctrl_pref_batch_free(b);
        return ctrl_error_set(CTRL_ERR_NOMEM, "preference batch: out of memory for %d tokens", T);
    }
    b->T = T, b->n_seq = n_seq, b->n_pairs = s->paired ? n : 0;
    const int trains = s->task != CTRL_PREF_REWARD; /* reward sequences have no completion tokens */
    int t = 0, seg = 0;
    cu[0] = 0;
    for (int k = 0; k < n_seq; k++) {
        const seq_ref q = seq_at(s, idx, n, k);
        int off;
        const int len = seq_window(s, &q, &off);
        b->seq_cu[k] = t, b->seq_len[k] = len, b->row[k] = q.row, b->n_tokens[k] = 0, b->last[k] = t;
        if (b->label) b->label[k] = s->rows[q.row].label;
        if (b->kl) b->kl[k] = (uint8_t)q.kl;
        for (int j = 0; j < len; j++, t++) {
            tok[t] = seq_token(&q, off + j);
            pos[t] = j;
            /* the log-prob at t is the next token's: a target where that token is a completion's */
            const int w = trains && j + 1 < len && off + j + 1 >= q.na;
            b->weight[t] = (float)w;
            tg[t] = w ? seq_token(&q, off + j + 1) : -100;
            b->n_tokens[k] += w;
            if (tok[t] != s->pad_id) b->last[k] = t;
        }
        b->n_completion[k] = b->n_tokens[k] + (trains && len > 0 && off >= q.na);
        if (!q.kl) b->tokens += len; /* TRL counts the attention mask of the main batch only */
        cu[++seg] = t;
        const int pad = s->padded        ? round_up(row_len[k / per_group], s->pad_multiple) - len
                        : k == n_seq - 1 ? T - t
                                         : 0;
        if (pad > 0) { /* a masked segment of its own: attends to nothing real, predicts nothing */
            for (int j = 0; j < pad; j++, t++) tok[t] = s->pad_id, pos[t] = j, tg[t] = -100, b->weight[t] = 0;
            cu[++seg] = t;
        }
    }
    b->seq_cu[n_seq] = T;
    for (int i = 0; b->margin && i < n; i++) b->margin[i] = s->rows[idx[i]].margin;
    return CTRL_OK;
}
