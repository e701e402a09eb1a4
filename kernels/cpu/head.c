/* The fused LM head (DESIGN §5): per-token log-probability of the target, entropy, log-sum-exp
 * and argmax-correctness, computed chunk by chunk over tokens and vocabulary so that the [T, V]
 * logits never exist in full. Scaled logits z = (h W^T) / temperature.
 *
 * Forward keeps, per token, a running max m, s = sum exp(z - m) and a = sum exp(z - m) z, so that
 *   lse = m + log s,  logp = z_target - lse,  entropy = lse - a / s.
 * Backward recomputes each chunk's z from lse (p = exp(z - lse)) and forms
 *   dz_j = dlogp (1[j = target] - p_j)  -  dentropy p_j (z_j - lse + H),
 * then dlogits = dz / temperature, dhidden = dlogits W and dW += dlogits^T h on chunks (sgemm).
 * With final-logit soft-capping (a->softcap = c > 0, Gemma 2) z = c tanh(h W^T / c) / temperature,
 * and dlogits takes the factor 1 - tanh^2 = 1 - (z temperature / c)^2 as well.
 * With a->targets_only the chunks are of the rows that have a target (gathered where they are not
 * contiguous, dhidden scattered back): prompt positions cost no logits (TRL's logits_to_keep). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include <ctrl/exp_approx.h>

#define DEFAULT_CHUNK_TOKENS 256
#define DEFAULT_CHUNK_VOCAB 8192

static int chunk_t(const ctrl_head_args *a) {
    int c = a->chunk_tokens > 0 ? a->chunk_tokens : DEFAULT_CHUNK_TOKENS;
    return c < a->T ? c : (a->T > 0 ? a->T : 1);
}

static int targeted(const ctrl_head_args *a, int t) { return a->targets[t] >= 0 && a->targets[t] < a->V; }

/* The rows the head computes, in order, into rows[T]: every row, or with targets_only those with a
 * target; the others get zero outputs (and zero dhidden rows where dhidden is given). Returns how
 * many. */
static int head_rows(const ctrl_head_args *a, int32_t *rows, float *logp, float *entropy, float *lse,
                     int32_t *correct, float *dhidden) {
    int n = 0;
    for (int t = 0; t < a->T; t++) {
        if (!a->targets_only || targeted(a, t)) {
            rows[n++] = t;
            continue;
        }
        if (logp) logp[t] = 0.0f;
        if (entropy) entropy[t] = 0.0f;
        if (lse) lse[t] = 0.0f;
        if (correct) correct[t] = 0;
        if (dhidden) memset(dhidden + (size_t)t * a->C, 0, sizeof(float) * (size_t)a->C);
    }
    return n;
}

/* Rows [r0, r0 + tc) of the list are contiguous in the batch (then read and written in place). */
static int contiguous(const int32_t *rows, int r0, int tc) { return rows[r0 + tc - 1] - rows[r0] == tc - 1; }

/* The chunk's hidden rows: in place, or gathered into buf. */
static const float *chunk_hidden(const ctrl_head_args *a, const int32_t *rows, int r0, int tc, float *buf) {
    if (contiguous(rows, r0, tc)) return a->hidden + (size_t)rows[r0] * a->C;
    ctrl_cpu_gather_rows(buf, a->hidden, rows + r0, NULL, tc, a->C);
    return buf;
}

/* Where the chunk's dhidden rows are formed: in place, or in buf (then chunk_dhidden_out). */
static float *chunk_dhidden(const ctrl_head_args *a, const int32_t *rows, int r0, int tc, float *dhidden,
                            float *buf) {
    return contiguous(rows, r0, tc) ? dhidden + (size_t)rows[r0] * a->C : buf;
}

static void chunk_dhidden_out(const ctrl_head_args *a, const int32_t *rows, int r0, int tc, float *dhidden,
                              const float *buf) {
    if (contiguous(rows, r0, tc)) return;
    for (int i = 0; i < tc; i++)
        memcpy(dhidden + (size_t)rows[r0 + i] * a->C, buf + (size_t)i * a->C, sizeof(float) * (size_t)a->C);
}

/* After a workspace's own part of `bytes`: the rows list, and with targets_only two chunks of tc
 * rows of C (hidden gathered, dhidden formed). */
static size_t rows_bytes(const ctrl_head_args *a, int tc) {
    return sizeof(int32_t) * (size_t)(a->T > 0 ? a->T : 1) +
           (a->targets_only ? 2 * sizeof(float) * (size_t)tc * (size_t)a->C : 0);
}
static int32_t *rows_at(void *workspace, size_t bytes) { return (int32_t *)((char *)workspace + bytes); }
static float *gather_at(const ctrl_head_args *a, void *workspace, size_t bytes, int tc, int which) {
    return (float *)((char *)workspace + bytes + sizeof(int32_t) * (size_t)(a->T > 0 ? a->T : 1)) +
           (size_t)which * tc * a->C;
}

/* W held only as its bf16 panels (a frozen embedding tied to the head: w and w16 NULL) */
static int panels_only(const ctrl_head_args *a) { return !a->w && !a->w16 && a->w_packed; }

static int chunk_v(const ctrl_head_args *a) {
    int c = a->chunk_vocab > 0 ? a->chunk_vocab : DEFAULT_CHUNK_VOCAB;
    const int block = panels_only(a) ? ctrl_cpu_gemm_bf16_packed_block(a->w_packed) : 0;
    if (block > 0) c = c < block ? block : c / block * block; /* the panels' column blocks, whole */
    return c < a->V ? c : a->V;
}

/* Layout: logits [Tc, Vc], then per-token m, s, a, z_target, best value, best index; the rows. */
static size_t own_bytes(const ctrl_head_args *a) {
    size_t tc = (size_t)chunk_t(a), vc = (size_t)chunk_v(a);
    return sizeof(float) * (tc * vc + 6 * tc);
}

size_t ctrl_cpu_head_workspace_bytes(const ctrl_head_args *a) {
    return own_bytes(a) + rows_bytes(a, chunk_t(a));
}

/* C = alpha op(A) op(B) + beta C (beta 0 or 1; alpha other than 1 only with beta 0), as cblas_sgemm
 * row-major; through the bf16 GEMM where the head computes in bf16 (a->bf16) and the CPU has one. */
static void head_gemm(const ctrl_head_args *a, int ta, int tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (a->bf16 && ctrl_cpu_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, beta != 0.0f) == 0) {
        if (alpha != 1.0f)
#pragma omp parallel for schedule(static)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= alpha;
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}

/* head_gemm with B = W's rows [w_row, w_row + (tb ? N : K)) held only as panels (panels_only): on
 * them, or (no bf16 kernel now, or no memory) on the rows unpacked into fp32; -1: no memory. */
static int panels_gemm(const ctrl_head_args *a, int tb, int M, int N, int K, float alpha, const float *A,
                       int lda, int w_row, float beta, float *C, int ldc) {
    const int n = tb ? N : K;
    if (ctrl_cpu_gemm_bf16_packed_cols(!tb, M, A, lda, a->w_packed, w_row, n, C, ldc, beta != 0.0f) == 0) {
        if (alpha != 1.0f)
#pragma omp parallel for schedule(static)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= alpha;
        return 0;
    }
    float *w = malloc(sizeof(float) * (size_t)n * a->C);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n);
    int st = w && rows ? 0 : -1;
    for (int i = 0; i < n && st == 0; i++) rows[i] = w_row + i;
    if (st == 0) st = ctrl_cpu_gemm_bf16_packed_rows(a->w_packed, rows, n, w, a->C);
    if (st == 0) head_gemm(a, 0, tb, M, N, K, alpha, A, lda, w, a->C, beta, C, ldc);
    free(w), free(rows);
    return st;
}

/* head_gemm with B = W from row w_row on: a->w, or where W is held only as bf16 values (w NULL: a
 * frozen embedding tied to the head, [peft] embedding_dtype = bf16) a->w16, as the same products
 * (ctrl_cpu_gemm_w16), or only as panels (panels_gemm); without the memory for them C reads NaN (a
 * non-finite loss, not a silent one). */
static void w_gemm(const ctrl_head_args *a, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   size_t w_row, float beta, float *C, int ldc) {
    if (panels_only(a)) {
        if (panels_gemm(a, tb, M, N, K, alpha, A, lda, (int)w_row, beta, C, ldc) != 0)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
        return;
    }
    if (a->w || !a->w16) {
        head_gemm(a, 0, tb, M, N, K, alpha, A, lda, a->w + w_row * (size_t)a->C, a->C, beta, C, ldc);
        return;
    }
    if (ctrl_cpu_gemm_w16(0, tb, M, N, K, alpha, A, lda, a->w16 + w_row * (size_t)a->C, a->C, C, ldc,
                          beta != 0.0f, a->bf16) != 0)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
}

/* tt_dw[k] += dz[:, tt_rows[k] - v0]^T h for the rows in [v0, v0 + vc): dz [tc, vc] (row stride ldz),
 * h [tc, C]; the products as dw's (head_gemm). */
static void rows_grad(const ctrl_head_args *a, const float *dz, int ldz, const float *h, int tc, int v0,
                      int vc) {
    for (int k = 0; k < a->tt_n; k++) {
        const int v = a->tt_rows[k];
        if (v >= v0 && v < v0 + vc)
            head_gemm(a, 1, 0, 1, a->C, tc, 1.0f, dz + (v - v0), ldz, h, a->C, 1.0f,
                      a->tt_dw + (size_t)k * a->C, a->C);
    }
}

/* Soft-capping of n raw logits in place: c tanh(x / c), then / temperature (as transformers caps
 * and TRL divides). */
static void softcap_rows(const ctrl_head_args *a, float *z, size_t n) {
    const float c = a->softcap, temp = a->temperature;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) z[i] = c * tanhf(z[i] / c) / temp;
}

/* logits chunk [tc, vc] = h[tc rows] W[v0 : v0+vc]^T / temperature (soft-capped first) */
static void chunk_logits(const ctrl_head_args *a, float *z, const float *h, int tc, int v0, int vc) {
    w_gemm(a, 1, tc, vc, a->C, a->softcap > 0 ? 1.0f : 1.0f / a->temperature, h, a->C, (size_t)v0, 0.0f, z,
           vc);
    if (a->softcap > 0) softcap_rows(a, z, (size_t)tc * vc);
}

void ctrl_cpu_head_forward(const ctrl_head_args *a, float *logp, float *entropy, float *lse, int32_t *correct,
                           void *workspace) {
    const int TC = chunk_t(a), VC = chunk_v(a);
    float *z = workspace, *m = z + (size_t)TC * VC, *s = m + TC, *acc = s + TC, *zt = acc + TC,
          *best = zt + TC;
    int32_t *arg = (int32_t *)(best + TC), *rows = rows_at(workspace, own_bytes(a));
    const int n = head_rows(a, rows, logp, entropy, lse, correct, NULL);
    for (int r0 = 0; r0 < n; r0 += TC) {
        const int tc = r0 + TC <= n ? TC : n - r0;
        const float *h = chunk_hidden(a, rows, r0, tc, gather_at(a, workspace, own_bytes(a), TC, 0));
        for (int i = 0; i < tc; i++)
            m[i] = -INFINITY, s[i] = 0, acc[i] = 0, zt[i] = 0, best[i] = -INFINITY, arg[i] = -1;
        for (int v0 = 0; v0 < a->V; v0 += VC) {
            const int vc = v0 + VC <= a->V ? VC : a->V - v0;
            chunk_logits(a, z, h, tc, v0, vc);
#pragma omp parallel for schedule(static)
            for (int i = 0; i < tc; i++) {
                const float *row = z + (size_t)i * vc;
                float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
                for (int j = 0; j < vc; j++) cm = row[j] > cm ? row[j] : cm;
                int ci = 0; /* the first maximum, as argmax */
                while (ci < vc - 1 && row[ci] != cm) ci++;
                if (cm > best[i]) best[i] = cm, arg[i] = v0 + ci;
                const float nm = cm > m[i] ? cm : m[i];
                const float rescale = m[i] == -INFINITY ? 0.0f : expf(m[i] - nm);
                double cs = 0, ca = 0;
#pragma omp simd reduction(+ : cs, ca)
                for (int j = 0; j < vc; j++) {
                    const float e = ctrl_exp_approx(row[j] - nm);
                    cs += e;
                    ca += (double)e * row[j];
                }
                s[i] = (float)(s[i] * rescale + cs);
                acc[i] = (float)(acc[i] * rescale + ca);
                m[i] = nm;
                const int32_t tg = a->targets[rows[r0 + i]];
                if (tg >= v0 && tg < v0 + vc) zt[i] = row[tg - v0];
            }
        }
        for (int i = 0; i < tc; i++) {
            const int t = rows[r0 + i];
            const float l = m[i] + logf(s[i]);
            lse[t] = l;
            const int has_target = a->targets[t] >= 0 && a->targets[t] < a->V;
            logp[t] = has_target ? zt[i] - l : 0.0f;
            if (entropy) entropy[t] = has_target ? l - acc[i] / s[i] : 0.0f;
            if (correct) correct[t] = has_target && arg[i] == a->targets[t];
        }
    }
}

void ctrl_cpu_head_backward(const ctrl_head_args *a, const float *lse, const float *dlogp,
                            const float *entropy, const float *dentropy, float *dhidden, float *dw,
                            void *workspace) {
    const int TC = chunk_t(a), VC = chunk_v(a);
    float *z = workspace;
    const float inv_temp = 1.0f / a->temperature;
    int32_t *rows = rows_at(workspace, own_bytes(a));
    const int n = head_rows(a, rows, NULL, NULL, NULL, NULL, dhidden);
    for (int r0 = 0; r0 < n; r0 += TC) {
        const int tc = r0 + TC <= n ? TC : n - r0;
        const float *h = chunk_hidden(a, rows, r0, tc, gather_at(a, workspace, own_bytes(a), TC, 0));
        float *dh = chunk_dhidden(a, rows, r0, tc, dhidden, gather_at(a, workspace, own_bytes(a), TC, 1));
        for (int v0 = 0; v0 < a->V; v0 += VC) {
            const int vc = v0 + VC <= a->V ? VC : a->V - v0;
            chunk_logits(a, z, h, tc, v0, vc);
#pragma omp parallel for schedule(static)
            for (int i = 0; i < tc; i++) {
                const int t = rows[r0 + i];
                float *row = z + (size_t)i * vc;
                const int32_t tg = a->targets[t];
                if (tg < 0 || tg >= a->V) {
                    memset(row, 0, sizeof(float) * (size_t)vc);
                    continue;
                }
                const float l = lse[t], g = dlogp[t];
                const float ge = dentropy ? dentropy[t] : 0.0f, H = entropy && dentropy ? entropy[t] : 0.0f;
                if (a->softcap > 0) { /* the same dz, times the cap's 1 - tanh^2 */
                    const float u = a->temperature / a->softcap;
                    for (int j = 0; j < vc; j++) {
                        const float zj = row[j], p = ctrl_exp_approx(zj - l), th = zj * u;
                        const float dz = -g * p - ge * p * (zj - l + H) + (j == tg - v0 ? g : 0.0f);
                        row[j] = dz * inv_temp * (1.0f - th * th);
                    }
                    continue;
                }
                if (ge != 0.0f) {
#pragma omp simd
                    for (int j = 0; j < vc; j++) {
                        const float p = ctrl_exp_approx(row[j] - l);
                        row[j] = (-g * p - ge * p * (row[j] - l + H)) * inv_temp;
                    }
                } else {
#pragma omp simd
                    for (int j = 0; j < vc; j++) row[j] = -g * ctrl_exp_approx(row[j] - l) * inv_temp;
                }
                if (tg >= v0 && tg < v0 + vc) row[tg - v0] += g * inv_temp;
            }
            /* dhidden[t0 : t0+tc] (+)= dlogits W[v0 : v0+vc];  dW[v0 : v0+vc] += dlogits^T h */
            w_gemm(a, 0, tc, a->C, vc, 1.0f, z, vc, (size_t)v0, v0 == 0 ? 0.0f : 1.0f, dh, a->C);
            if (dw) /* NULL: a frozen head (LoRA) */
                head_gemm(a, 1, 0, vc, a->C, tc, 1.0f, z, vc, h, a->C, 1.0f, dw + (size_t)v0 * a->C, a->C);
            rows_grad(a, z, vc, h, tc, v0, vc); /* trainable_token_indices' rows */
        }
        chunk_dhidden_out(a, rows, r0, tc, dhidden, dh);
    }
}

/* The fused forward + backward for a dL/dlogp known before the forward (SFT's token NLL): each
 * chunk of tokens gets its logits over the whole vocabulary at once, so that lse is final before
 * the chunk's gradient is formed; the logits are not recomputed (three vocabulary GEMMs instead of
 * four) and exp runs once per logit. The chunk is sized to FUSED_BUDGET floats, but at least
 * FUSED_MIN_TOKENS tokens (128 x 151,936 vocabulary: 74 MiB). */
#define FUSED_BUDGET (8 << 20)
#define FUSED_MIN_TOKENS                                                                                     \
    128 /* below, dW += dz^T h runs a short inner dimension (151k vocab: 0.83x at 55)                        \
         */

static int fused_chunk_t(const ctrl_head_args *a) {
    int c = a->chunk_tokens > 0 ? a->chunk_tokens : FUSED_BUDGET / (a->V > 0 ? a->V : 1);
    if (a->chunk_tokens <= 0 && c < FUSED_MIN_TOKENS) c = FUSED_MIN_TOKENS;
    c = c < 1 ? 1 : c > DEFAULT_CHUNK_TOKENS ? DEFAULT_CHUNK_TOKENS : c;
    return c < a->T ? c : (a->T > 0 ? a->T : 1);
}

/* The chunk's logits; with soft-capping also each logit's 1 - tanh^2 after them; the rows. */
static size_t fused_own_bytes(const ctrl_head_args *a) {
    return sizeof(float) * (size_t)fused_chunk_t(a) * (size_t)a->V * (a->softcap > 0 ? 2 : 1);
}

size_t ctrl_cpu_head_fused_workspace_bytes(const ctrl_head_args *a) {
    return fused_own_bytes(a) + rows_bytes(a, fused_chunk_t(a));
}

/* z [tc, V] = h W^T * alpha: on W's panels wp where there are (not for 4 rows or fewer, which
 * ctrl_cpu_gemm_bf16 multiplies unpacked, summing in another order), else as head_gemm. */
static void fused_logits(const ctrl_head_args *a, const ctrl_cpu_bf16_packed *wp, float *z, const float *h,
                         int tc, float alpha) {
    if (a->bf16 && wp && tc > 4 && ctrl_cpu_gemm_bf16_packed(0, tc, h, a->C, wp, z, a->V, 0) == 0) {
        if (alpha != 1.0f)
#pragma omp parallel for schedule(static)
            for (int i = 0; i < tc; i++)
                for (int j = 0; j < a->V; j++) z[(size_t)i * a->V + j] *= alpha;
        return;
    }
    w_gemm(a, 1, tc, a->V, a->C, alpha, h, a->C, 0, 0.0f, z, a->V);
}

/* W's bf16 panels for every chunk of a fused call: the caller's (a->w_packed), else packed here once
 * (*own, freed by the caller) where there is more than one chunk -- instead of W packed anew for each
 * chunk's logits and again for its dhidden = dz W (2 x 151,936 x 896 values a chunk at Qwen's
 * vocabulary). The panels take 2 bytes a value while the call runs (272 MB there): done where the head
 * trains (dw: a full fine-tune, whose peak is the optimizer's state, +3% of it at 0.5B), not for a
 * frozen head (LoRA, whose peak is this call: +13% for 5% of the step; docs/performance.md, issue 18).
 * CTRL_HEAD_PACK_PER_CHUNK=1 packs per chunk always, =0 once a call always (for comparisons). NULL:
 * per chunk (fp32 head, no bf16 kernel, W held as bf16 values, one chunk). */
static const ctrl_cpu_bf16_packed *fused_panels(const ctrl_head_args *a, int n, int TC, const float *dw,
                                                ctrl_cpu_bf16_packed **own) {
    *own = NULL;
    if (!a->bf16 || a->w_packed || !a->w || n <= TC || n <= 4) return a->w_packed;
    const char *v = getenv("CTRL_HEAD_PACK_PER_CHUNK");
    const int per_chunk = v && *v ? strcmp(v, "0") != 0 : !dw;
    if (per_chunk) return NULL;
    if (!a->w_keep || !dw)
        return *own = ctrl_cpu_gemm_bf16_pack(1, a->V, a->C, a->w, a->C); /* NULL: per chunk */
    ctrl_cpu_bf16_packed **keep = a->w_keep; /* the caller's: packed again in place, not reallocated */
    if (ctrl_cpu_gemm_bf16_packed_is(*keep, 1, a->V, a->C) &&
        ctrl_cpu_gemm_bf16_repack(*keep, a->w, a->C) == 0)
        return *keep;
    ctrl_cpu_gemm_bf16_packed_free(*keep);
    return *keep = ctrl_cpu_gemm_bf16_pack(1, a->V, a->C, a->w, a->C);
}

void ctrl_cpu_head_forward_backward(const ctrl_head_args *a, const float *dlogp, float *logp, float *entropy,
                                    float *lse, int32_t *correct, float *dhidden, float *dw,
                                    void *workspace) {
    const int TC = fused_chunk_t(a), V = a->V, C = a->C;
    const float inv_temp = 1.0f / a->temperature;
    float *z = workspace, *capd = a->softcap > 0 ? z + (size_t)TC * V : NULL;
    int32_t *rows = rows_at(workspace, fused_own_bytes(a));
    const int n = head_rows(a, rows, logp, entropy, lse, correct, dhidden);
    ctrl_cpu_bf16_packed *own;
    const ctrl_cpu_bf16_packed *wp = fused_panels(a, n, TC, dw, &own);
    for (int r0 = 0; r0 < n; r0 += TC) {
        const int tc = r0 + TC <= n ? TC : n - r0;
        const float *h = chunk_hidden(a, rows, r0, tc, gather_at(a, workspace, fused_own_bytes(a), TC, 0));
        float *dh =
            chunk_dhidden(a, rows, r0, tc, dhidden, gather_at(a, workspace, fused_own_bytes(a), TC, 1));
        fused_logits(a, wp, z, h, tc, capd ? 1.0f : inv_temp);
        if (capd) softcap_rows(a, z, (size_t)tc * V);
#pragma omp parallel for schedule(static)
        for (int i = 0; i < tc; i++) {
            const int t = rows[r0 + i];
            float *row = z + (size_t)i * V;
            float m = -INFINITY;
#pragma omp simd reduction(max : m)
            for (int j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
            int arg = 0; /* the first maximum, as argmax */
            while (arg < V - 1 && row[arg] != m) arg++;
            const int32_t tg = a->targets[t];
            const int has_target = tg >= 0 && tg < V;
            const float zt = has_target ? row[tg] : 0.0f;
            if (capd) { /* 1 - tanh^2 of each capped logit, for the gradient below */
                float *f = capd + (size_t)i * V;
                const float u = a->temperature / a->softcap;
                for (int j = 0; j < V; j++) f[j] = 1.0f - (row[j] * u) * (row[j] * u);
            }
            double s = 0, acc = 0;
#pragma omp simd reduction(+ : s, acc)
            for (int j = 0; j < V; j++) { /* row becomes exp(z - m) */
                const float e = ctrl_exp_approx(row[j] - m);
                s += e;
                acc += (double)e * row[j];
                row[j] = e;
            }
            const float l = m + logf((float)s);
            lse[t] = l;
            logp[t] = has_target ? zt - l : 0.0f;
            if (entropy) entropy[t] = has_target ? l - (float)(acc / s) : 0.0f;
            if (correct) correct[t] = has_target && arg == tg;
            /* dz_j = dlogp (1[j = target] - p_j), p_j = e_j / s; then / temperature */
            const float g = has_target ? dlogp[t] : 0.0f, k = (float)(-g * inv_temp / s);
#pragma omp simd
            for (int j = 0; j < V; j++) row[j] *= k;
            if (has_target) row[tg] += g * inv_temp;
            if (capd) {
                const float *f = capd + (size_t)i * V;
#pragma omp simd
                for (int j = 0; j < V; j++) row[j] *= f[j];
            }
        }
        /* dhidden = dz W: on the same panels read transposed (bit for bit the product packing W) */
        if (!(a->bf16 && wp && ctrl_cpu_gemm_bf16_packed_t(0, tc, z, V, wp, dh, C, 0) == 0))
            w_gemm(a, 0, tc, C, V, 1.0f, z, V, 0, 0.0f, dh, C);
        if (dw) /* NULL: a frozen head (LoRA) */
            head_gemm(a, 1, 0, V, C, tc, 1.0f, z, V, h, C, 1.0f, dw, C);
        rows_grad(a, z, V, h, tc, 0, V); /* trainable_token_indices' rows */
        chunk_dhidden_out(a, rows, r0, tc, dhidden, dh);
    }
    ctrl_cpu_gemm_bf16_packed_free(own);
}
