/* TRL 1.16's DPO losses and their gradients (see dpo_loss.h). Per pair i, with policy sums c, r and
 * reference sums c_ref, r_ref of the chosen and rejected completions:
 *   logratios  lc = c - c_ref, lr = r - r_ref
 *   scores     s = f'(logratio) of the f-divergence: x (reverse_kl), 1 - e^-x (forward_kl),
 *              log 2 + log sigmoid(x) (js_divergence), (e^((a-1)x) - 1) / (a-1) (alpha_divergence,
 *              the exponent clamped at 80 as TRL clamps it in fp32)
 *   delta      = s_c - s_r
 * and each loss_type's per-pair loss as TRL writes it. Every loss is differentiated by hand into
 * dL/dlc and dL/dlr (= dL/dc and dL/dr); the sft loss_type's gradient is per token. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "../trainer_sigmoid.h"
#include "dpo_loss.h"

static double logsig(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

/* f'(t) at x = log t and its derivative with respect to x. */
static double score(const dpo_params *p, double x, double *ds) {
    switch (p->fdiv) {
    case DPO_FORWARD_KL: *ds = exp(-x); return 1 - exp(-x);
    case DPO_JS_DIVERGENCE: *ds = trainer_sigmoid(-x); return log(2.0) + logsig(x);
    case DPO_ALPHA_DIVERGENCE:
        if (fabs(p->alpha_coef - 1.0) >= 1e-6) {
            const double a1 = p->alpha_coef - 1.0, t = a1 * x;
            if (t >= 80.0) {
                *ds = 0;
                return (exp(80.0) - 1.0) / a1;
            }
            *ds = exp(t);
            return (exp(t) - 1.0) / a1;
        }
        break;
    default: break;
    }
    *ds = 1;
    return x;
}

/* Sorts idx[0..n) by key ascending (n is a micro-batch's pairs: insertion sort). */
static void sort_by(int *idx, const double *key, int n) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && key[idx[j]] < key[idx[j - 1]]; j--) {
            int tmp = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = tmp;
        }
}

/* -log sigmoid(beta d) (1 - eps) - log sigmoid(-beta d) eps and its derivative in d (aot's). */
static double smoothed(double beta, double eps, double d, double *dd) {
    const double u = beta * d;
    *dd = beta * (-(1 - eps) * trainer_sigmoid(-u) + eps * trainer_sigmoid(u));
    return -logsig(u) * (1 - eps) - logsig(-u) * eps;
}

typedef struct pair_terms {
    double lc, lr, sc, sr, dsc, dsr, delta; /* logratios, scores and their derivatives, delta */
    int nc, nr;                             /* completion tokens */
} pair_terms;

/* One pair's loss of type `lt` and its partial derivatives in lc and lr (the sorted and the
 * token-level losses are handled by the caller). */
static double pair_loss(const dpo_params *p, int lt, const pair_terms *q, double *gc, double *gr) {
    const double beta = p->beta, eps = p->label_smoothing, u = beta * q->delta;
    double dd = 0, L = 0; /* dL/ddelta for the losses of delta */
    *gc = *gr = 0;
    switch (lt) {
    case DPO_SIGMOID: L = -logsig(u), dd = -beta * trainer_sigmoid(-u); break;
    case DPO_HINGE:
        L = 1 - u > 0 ? 1 - u : 0;
        dd = 1 - u > 0 ? -beta : 0;
        break;
    case DPO_IPO:
    case DPO_SIGMOID_NORM: {
        const double nc = q->nc > 1 ? q->nc : 1, nr = q->nr > 1 ? q->nr : 1;
        const double d = q->sc / nc - q->sr / nr;
        double g;
        if (lt == DPO_IPO) {
            const double e = d - 1 / (2 * beta);
            L = e * e, g = 2 * e;
        } else {
            L = -logsig(beta * d), g = -beta * trainer_sigmoid(-beta * d);
        }
        *gc = g / nc * q->dsc, *gr = -g / nr * q->dsr;
        return L;
    }
    case DPO_EXO_PAIR: {
        const double qw = trainer_sigmoid(u), ql = trainer_sigmoid(-u), lqw = logsig(u), lql = logsig(-u);
        const double lpw = log1p(-eps), lpl = log(eps);
        L = qw * (lqw - lpw) + ql * (lql - lpl);
        dd = beta * qw * ql * ((lqw - lpw) - (lql - lpl));
        break;
    }
    case DPO_NCA_PAIR: {
        const double cr = beta * q->lc, rr = beta * q->lr;
        L = -logsig(cr) - 0.5 * logsig(-cr) - 0.5 * logsig(-rr);
        *gc = beta * (-trainer_sigmoid(-cr) + 0.5 * trainer_sigmoid(cr)),
        *gr = beta * 0.5 * trainer_sigmoid(rr);
        return L;
    }
    case DPO_ROBUST:
        L = (-(1 - eps) * logsig(u) + eps * logsig(-u)) / (1 - 2 * eps);
        dd = beta * (-(1 - eps) * trainer_sigmoid(-u) - eps * trainer_sigmoid(u)) / (1 - 2 * eps);
        break;
    case DPO_BCO_PAIR: {
        const double cr = beta * q->lc, rr = beta * q->lr;
        L = -logsig(cr) - logsig(-rr);
        *gc = -beta * trainer_sigmoid(-cr), *gr = beta * trainer_sigmoid(rr);
        return L;
    }
    case DPO_SPPO_HARD: {
        const double a = q->lc - 0.5 / beta, b = q->lr + 0.5 / beta;
        *gc = 2 * a, *gr = 2 * b;
        return a * a + b * b;
    }
    case DPO_APO_ZERO: {
        const double sc = trainer_sigmoid(beta * q->lc), sr = trainer_sigmoid(beta * q->lr);
        *gc = -beta * sc * (1 - sc), *gr = beta * sr * (1 - sr);
        return 1 - sc + sr;
    }
    case DPO_APO_DOWN: {
        const double sc = trainer_sigmoid(beta * q->lc), sd = trainer_sigmoid(beta * (q->lc - q->lr));
        *gc = beta * sc * (1 - sc) - beta * sd * (1 - sd), *gr = beta * sd * (1 - sd);
        return sc + 1 - sd;
    }
    case DPO_DISCOPOP: {
        const double tau = p->discopop_tau, m = trainer_sigmoid(u / tau), dm = m * (1 - m) / tau, e = exp(-u);
        L = -logsig(u) * (1 - m) + e * m;
        dd = beta * (-trainer_sigmoid(-u) * (1 - m) + logsig(u) * dm - e * m + e * dm);
        break;
    }
    default: break;
    }
    *gc = dd * q->dsc, *gr = -dd * q->dsr;
    return L;
}

/* WPO's weight of a sequence: exp of the mean over its completion tokens of logp - log sum p^2. */
static double wpo_weight(const ctrl_sequence_batch *b, int s) {
    double acc = 0;
    int n = 0;
    for (int32_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++)
        if (b->weight[t] != 0) acc += ((double)b->logp[t] - b->log_sum_sq[t]) * b->weight[t], n++;
    return exp(acc / (n > 1 ? n : 1));
}

/* TRL's metrics of the micro-batch (its _compute_loss logs them once per call). With several ranks,
 * from sums over them, as TRL gathers its processes' values: the per-pair metrics over every
 * rank's pairs, the token-weighted ones (logits/chosen and rejected, entropy, mean_token_accuracy) as the
 * ranks' summed values over their summed tokens. */
static ctrl_status report_metrics(const dpo_params *p, const ctrl_sequence_batch *b, const pair_terms *q) {
    const int B = b->n_pairs;
    enum { RC, RR, ACC, LC, LR, PAIRS, ML0, NT0, ML1, NT1, ENT, TOK, OK, CHOSEN, NV };
    double v[NV] = {0};
    for (int i = 0; i < B; i++) {
        v[RC] += p->beta * q[i].lc, v[RR] += p->beta * q[i].lr;
        v[ACC] += p->beta * q[i].lc > p->beta * q[i].lr;
        v[LC] += b->logp_sum[i], v[LR] += b->logp_sum[B + i];
    }
    v[PAIRS] = B;
    for (int s = 0; b->mean_logit && s < 2 * B; s++)
        v[s < B ? ML0 : ML1] += b->mean_logit[s] * b->n_tokens[s], v[s < B ? NT0 : NT1] += b->n_tokens[s];
    for (int s = 0; s < 2 * B; s++)
        for (int32_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++) {
            if (b->weight[t] == 0) continue;
            v[TOK] += 1;
            if (b->entropy) v[ENT] += b->entropy[t];
            if (s < B) v[CHOSEN] += 1, v[OK] += b->correct ? b->correct[t] != 0 : 0;
        }
    if (b->size >= offsetof(ctrl_sequence_batch, sum_over_ranks) + sizeof(void *) && b->sum_over_ranks) {
        ctrl_status st = b->sum_over_ranks(v, NV);
        if (st != CTRL_OK) return ctrl_error_wrap(st, "trainer dpo: metrics over the ranks");
    }
    const double n = v[PAIRS];
    b->report(b->report_ctx, "rewards/chosen", v[RC] / n);
    b->report(b->report_ctx, "rewards/rejected", v[RR] / n);
    b->report(b->report_ctx, "rewards/accuracies", v[ACC] / n);
    b->report(b->report_ctx, "rewards/margins", (v[RC] - v[RR]) / n);
    b->report(b->report_ctx, "logps/chosen", v[LC] / n);
    b->report(b->report_ctx, "logps/rejected", v[LR] / n);
    if (b->mean_logit) {
        b->report(b->report_ctx, "logits/chosen", v[NT0] > 0 ? v[ML0] / v[NT0] : 0.0);
        b->report(b->report_ctx, "logits/rejected", v[NT1] > 0 ? v[ML1] / v[NT1] : 0.0);
    }
    if (b->entropy) b->report(b->report_ctx, "entropy", v[TOK] > 0 ? v[ENT] / v[TOK] : 0.0);
    if (b->correct) b->report(b->report_ctx, "mean_token_accuracy", v[CHOSEN] > 0 ? v[OK] / v[CHOSEN] : 0.0);
    return CTRL_OK;
}

ctrl_status dpo_loss(const dpo_params *p, const ctrl_sequence_batch *b, double *loss, double *dlogp_sum,
                     float *dlogp, int *per_token) {
    const int B = b->n_pairs;
    pair_terms *q = calloc((size_t)B, sizeof *q);
    double *w = malloc(sizeof(double) * (size_t)B), *key = malloc(sizeof(double) * (size_t)B);
    double *key2 = malloc(sizeof(double) * (size_t)B);
    int *ia = malloc(sizeof(int) * (size_t)B), *ib = malloc(sizeof(int) * (size_t)B);
    if (!q || !w || !key || !key2 || !ia || !ib) {
        free(q), free(w), free(key), free(key2), free(ia), free(ib);
        return ctrl_error_set(CTRL_ERR_NOMEM, "trainer dpo: out of memory for %d pairs", B);
    }
    /* IPO's and sigmoid_norm's lengths: TRL's completion_mask sums */
    const int *nt = b->size >= offsetof(ctrl_sequence_batch, n_completion) + sizeof(void *) && b->n_completion
                        ? b->n_completion
                        : b->n_tokens;
    for (int i = 0; i < B; i++) {
        pair_terms *x = &q[i];
        x->lc = b->logp_sum[i] - b->ref_logp_sum[i];
        x->lr = b->logp_sum[B + i] - b->ref_logp_sum[B + i];
        x->sc = score(p, x->lc, &x->dsc);
        x->sr = score(p, x->lr, &x->dsr);
        x->delta = x->sc - x->sr;
        x->nc = nt[i], x->nr = nt[B + i];
        w[i] = p->use_weighting ? wpo_weight(b, i) * wpo_weight(b, B + i) : 1.0;
    }
    for (int s = 0; s < 2 * B; s++) dlogp_sum[s] = 0;
    *per_token = 0;
    double L = 0;
    const double inv = 1.0 / b->num_items;
    for (int k = 0; k < p->n_losses; k++) {
        const int lt = p->loss[k];
        const double scale = p->weight[k] * inv;
        if (lt == DPO_AOT || lt == DPO_AOT_UNPAIRED) { /* sorted over the micro-batch */
            for (int i = 0; i < B; i++) {
                if (lt == DPO_AOT)
                    key[i] = b->logp_sum[i] - b->logp_sum[B + i],
                    key2[i] = b->ref_logp_sum[i] - b->ref_logp_sum[B + i];
                else
                    key[i] = q[i].lc, key2[i] = q[i].lr;
            }
            sort_by(ia, key, B), sort_by(ib, key2, B);
            for (int j = 0; j < B; j++) {
                double dd;
                L += scale * smoothed(p->beta, p->label_smoothing, key[ia[j]] - key2[ib[j]], &dd);
                /* aot: d/dc and -d/dr of pair ia[j] (the reference's sort carries no gradient);
                 * aot_unpaired: d/dlc of ia[j], -d/dlr of ib[j] */
                dlogp_sum[ia[j]] += scale * dd;
                dlogp_sum[B + (lt == DPO_AOT ? ia[j] : ib[j])] -= scale * dd;
            }
            continue;
        }
        if (lt == DPO_SFT) { /* -mean over the chosen completion tokens of the micro-batch, per pair */
            double sum = 0, n = 0;
            for (int32_t t = b->cu_seqlens[0]; t < b->cu_seqlens[B]; t++)
                if (b->weight[t] != 0) sum += b->logp[t], n += 1;
            if (!*per_token)
                for (int t = 0; t < b->T; t++) dlogp[t] = 0;
            *per_token = 1;
            L += scale * B * (n > 0 ? -sum / n : NAN);
            for (int32_t t = b->cu_seqlens[0]; t < b->cu_seqlens[B]; t++)
                if (b->weight[t] != 0) dlogp[t] += (float)(-scale * B / n);
            continue;
        }
        for (int i = 0; i < B; i++) {
            double gc, gr;
            L += scale * w[i] * pair_loss(p, lt, &q[i], &gc, &gr);
            dlogp_sum[i] += scale * w[i] * gc, dlogp_sum[B + i] += scale * w[i] * gr;
        }
    }
    *loss = L;
    const ctrl_status st = b->report ? report_metrics(p, b, q) : CTRL_OK;
    free(q), free(w), free(key), free(key2), free(ia), free(ib);
    return st;
}
