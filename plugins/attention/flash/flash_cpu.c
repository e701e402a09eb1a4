/* Flash attention on the CPU, fp32 (FlashAttention-2's algorithm on tiles of 64 x 64):
 * forward keeps, per query row of a tile, a running max m, sum l and output accumulator, visiting
 * only key tiles that the causal/window mask leaves visible, and saves lse = m + log l. Backward
 * recomputes P = exp(S - lse) tile by tile with D = rowsum(dO * O):
 *   dV += P^T dO,  dS = P * (dO V^T - D),  dQ += scale dS K,  dK += scale dS^T Q.
 * Every tile product is one single-threaded SGEMM straight on the strided [T, heads, D] layout (small
 * tiles: plain loops)
 * (OpenBLAS runs single-threaded inside our parallel region), so the arithmetic runs at GEMM speed.
 * Work is split over (sequence, kv head) in backward, so dK/dV of a GQA group and dQ of its heads
 * are written by one thread: deterministic, no atomics.
 * Soft-capping (Gemma 2, a->softcap > 0): each tile's scores become cap tanh(S / cap) before the mask,
 * and backward multiplies dS by 1 - tanh^2 (kept per tile element in F). */
#include "flash_cpu.h"

#include "../attention_plugin_common.h"

#include <ctrl/exp_approx.h>

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ FLASH_BLOCK_Q
#define BK FLASH_BLOCK_K

/* Key j is visible from query i (positions within their sequence; attention_mask.h). */
static inline int visible(const ctrl_attention_args *a, int i, int j) {
    return ctrl_attention_visible(a->causal, a->window, i, j);
}

/* The key range [lo, hi) any query in [q0, q1) can see. */
static void key_range(const ctrl_attention_args *a, int q0, int q1, int L, int *lo, int *hi) {
    *lo = ctrl_attention_first_key(a->window, q0);
    *hi = ctrl_attention_key_end(a->causal, q1, L);
}

/* C = alpha op(A) op(B) + beta C (row-major). Through OpenBLAS when the tile is big enough to pay for
 * the call (short sequences, e.g. 8-token examples, would spend more in call overhead and packing
 * than in arithmetic); plain loops otherwise. */
static void tile_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    if ((long)M * N * K >= 32768) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                    M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++)
                acc += (trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                       (trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            C[(size_t)i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * C[(size_t)i * ldc + j] : 0.0f);
        }
}

/* S = scale * Q_tile K_tile^T (one GEMM), then -inf where the mask hides a pair (interior tiles,
 * fully visible, skip the mask pass). */
static void tile_scores(const ctrl_attention_args *a, float *S, int s0, int h, int kvh, int q0, int nq,
                        int k0, int nk) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head;
    const float *q = (const float *)a->q + ((size_t)(s0 + q0) * H + h) * D;
    const float *k = (const float *)a->k + ((size_t)(s0 + k0) * HK + kvh) * D;
    tile_gemm(0, 1, nq, nk, D, a->scale, q, H * D, k, HK * D, 0.0f, S, BK);
    if (a->softcap > 0)
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nk; j++) S[i * BK + j] = attention_softcap(S[i * BK + j], a->softcap);
    const int fully_visible = visible(a, q0, k0 + nk - 1) && visible(a, q0 + nq - 1, k0);
    if (fully_visible) return;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            if (!visible(a, q0 + i, k0 + j)) S[i * BK + j] = -INFINITY;
}

ctrl_status flash_cpu_forward(const ctrl_attention_args *a) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head, group = H / HK, T = a->total_tokens;
    const float *v = a->v;
    float *out = a->out;
    /* One task per (sequence, head, query tile); tiles are listed up front for the scheduler. */
    int n_tasks = 0;
    for (int b = 0; b < a->n_seqs; b++) {
        int L = a->cu_seqlens_host[b + 1] - a->cu_seqlens_host[b];
        n_tasks += H * ((L + BQ - 1) / BQ);
    }
    int failed = 0;
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * BQ * BK), *acc = malloc(sizeof(float) * BQ * (size_t)D);
        float m[BQ], l[BQ];
        if (!S || !acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int task = 0; task < n_tasks; task++) {
            if (!S || !acc) continue;
            /* Decode the task into (sequence, head, query tile). */
            int t = task, b = 0, L = 0;
            for (;; b++) {
                L = a->cu_seqlens_host[b + 1] - a->cu_seqlens_host[b];
                int per = H * ((L + BQ - 1) / BQ);
                if (t < per) break;
                t -= per;
            }
            const int tiles = (L + BQ - 1) / BQ, h = t / tiles, q0 = (t % tiles) * BQ, kvh = h / group;
            const int s0 = a->cu_seqlens_host[b], nq = q0 + BQ <= L ? BQ : L - q0;
            for (int i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0;
            memset(acc, 0, sizeof(float) * BQ * (size_t)D);
            int lo, hi;
            key_range(a, q0, q0 + nq, L, &lo, &hi);
            for (int k0 = (lo / BK) * BK; k0 < hi; k0 += BK) {
                const int nk = k0 + BK <= L ? BK : L - k0;
                tile_scores(a, S, s0, h, kvh, q0, nq, k0, nk);
                /* online softmax per row: S becomes P = exp(S - m_new); acc and l rescaled */
                for (int i = 0; i < nq; i++) {
                    float *row = S + i * BK, mx = m[i];
#pragma omp simd reduction(max : mx)
                    for (int j = 0; j < nk; j++) mx = row[j] > mx ? row[j] : mx;
                    if (mx == -INFINITY) { /* nothing visible in this row of the tile */
                        for (int j = 0; j < nk; j++) row[j] = 0.0f;
                        continue;
                    }
                    const float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
                    float sum = 0;
#pragma omp simd reduction(+ : sum)
                    for (int j = 0; j < nk; j++) {
                        const float p = row[j] == -INFINITY ? 0.0f : ctrl_exp_approx(row[j] - mx);
                        row[j] = p;
                        sum += p;
                    }
                    float *ai = acc + (size_t)i * D;
                    if (corr != 1.0f)
                        for (int d = 0; d < D; d++) ai[d] *= corr;
                    l[i] = l[i] * corr + sum;
                    m[i] = mx;
                }
                /* acc += P V_tile */
                const float *vt = v + ((size_t)(s0 + k0) * HK + kvh) * D;
                tile_gemm(0, 0, nq, D, nk, 1.0f, S, BK, vt, HK * D, 1.0f, acc, D);
            }
            for (int i = 0; i < nq; i++) {
                float *oi = out + ((size_t)(s0 + q0 + i) * H + h) * D;
                const float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
                for (int d = 0; d < D; d++) oi[d] = acc[(size_t)i * D + d] * inv;
                if (a->lse) a->lse[(size_t)h * T + s0 + q0 + i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
            }
        }
        free(S);
        free(acc);
    }
    if (failed) return ctrl_error_set(CTRL_ERR_NOMEM, "attention flash: no memory for a tile");
    return CTRL_OK;
}

ctrl_status flash_cpu_backward(const ctrl_attention_args *a) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head, group = H / HK, T = a->total_tokens;
    const float *q = a->q, *k = a->k, *v = a->v, *o = a->out, *dout = a->dout;
    float *dq = a->dq, *dk = a->dk, *dv = a->dv;
    memset(dq, 0, sizeof(float) * (size_t)T * H * D);
    memset(dk, 0, sizeof(float) * (size_t)T * HK * D);
    memset(dv, 0, sizeof(float) * (size_t)T * HK * D);
    /* D_i = dO_i . O_i, per (token, head) */
    float *Dv = malloc(sizeof(float) * (size_t)T * H);
    if (!Dv) return ctrl_error_set(CTRL_ERR_NOMEM, "attention flash: backward scratch");
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)T * H; r++) {
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < D; d++) s += dout[r * D + d] * o[r * D + d];
        Dv[r] = s;
    }
    int failed = 0;
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * BQ * BK), *dP = malloc(sizeof(float) * BQ * BK),
              *F = a->softcap > 0 ? malloc(sizeof(float) * BQ * BK) : NULL;
        if (!S || !dP || (a->softcap > 0 && !F)) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < a->n_seqs; b++)
            for (int kvh = 0; kvh < HK; kvh++) {
                if (!S || !dP || (a->softcap > 0 && !F)) continue;
                const int s0 = a->cu_seqlens_host[b], L = a->cu_seqlens_host[b + 1] - s0;
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int q0 = 0; q0 < L; q0 += BQ) {
                        const int nq = q0 + BQ <= L ? BQ : L - q0;
                        const size_t qo = ((size_t)(s0 + q0) * H + h) * D;
                        int lo, hi;
                        key_range(a, q0, q0 + nq, L, &lo, &hi);
                        for (int k0 = (lo / BK) * BK; k0 < hi; k0 += BK) {
                            const int nk = k0 + BK <= L ? BK : L - k0;
                            const size_t ko = ((size_t)(s0 + k0) * HK + kvh) * D;
                            tile_scores(a, S, s0, h, kvh, q0, nq, k0, nk);
                            for (int i = 0; i < nq; i++) { /* S becomes P */
                                const float lse = a->lse[(size_t)h * T + s0 + q0 + i];
                                float *row = S + i * BK;
                                if (F) /* 1 - tanh^2 of each capped score, for dS */
                                    for (int j = 0; j < nk; j++)
                                        F[i * BK + j] = row[j] == -INFINITY
                                                            ? 0.0f
                                                            : attention_softcap_grad(row[j], a->softcap);
                                for (int j = 0; j < nk; j++)
                                    row[j] = row[j] == -INFINITY ? 0.0f : ctrl_exp_approx(row[j] - lse);
                            }
                            /* dV += P^T dO;  dP = dO V^T */
                            tile_gemm(1, 0, nk, D, nq, 1.0f, S, BK, dout + qo, H * D, 1.0f, dv + ko, HK * D);
                            tile_gemm(0, 1, nq, nk, D, 1.0f, dout + qo, H * D, v + ko, HK * D, 0.0f, dP, BK);
                            for (int i = 0; i < nq; i++) { /* dS = P * (dP - D_i) */
                                const float Di = Dv[(size_t)(s0 + q0 + i) * H + h];
                                float *ds = dP + i * BK;
                                const float *p = S + i * BK;
#pragma omp simd
                                for (int j = 0; j < nk; j++) ds[j] = p[j] * (ds[j] - Di);
                                if (F)
                                    for (int j = 0; j < nk; j++) ds[j] *= F[i * BK + j];
                            }
                            /* dQ += scale dS K;  dK += scale dS^T Q */
                            tile_gemm(0, 0, nq, D, nk, a->scale, dP, BK, k + ko, HK * D, 1.0f, dq + qo,
                                      H * D);
                            tile_gemm(1, 0, nk, D, nq, a->scale, dP, BK, q + qo, H * D, 1.0f, dk + ko,
                                      HK * D);
                        }
                    }
            }
        free(S);
        free(dP);
        free(F);
    }
    free(Dv);
    if (failed) return ctrl_error_set(CTRL_ERR_NOMEM, "attention flash: no memory for a tile");
    return CTRL_OK;
}
