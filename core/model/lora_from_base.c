/* PEFT's initialisations that read the base weight and change it (peft 0.21, tuners/lora/layer.py),
 * run on each adapted projection weight as it loads in fp32, before it is narrowed to bf16 or NF4:
 *   pissa  (pissa_init)  W = V S U^T (PEFT: torch.linalg.svd in float32; here its top r triplets, below):
 *          A = sqrt(S_r / s) U_r^T, B = V_r sqrt(S_r / s), and W -= s B A (the residual keeps the rest);
 *   olora  (olora_init)  W = Q R (float32 Householder QR, LAPACK as torch.linalg.qr; its first r reflectors):
 *          A = R[:r], B = Q[:, :r], and W -= s B A;
 * s the module's scaling (alpha / r, rank_pattern / alpha_pattern included). An adapter PEFT saved so
 * (its adapter_config.json says pissa or olora) is loaded the same way: the residual recomputed from
 * the original base, then A and B replaced by the file's, as PeftModel.from_pretrained does. A
 * singular vector's sign is LAPACK's choice: A's row j and B's column j may both be negated against
 * torch's, which leaves B A, the residual and training (AdamW is odd in the gradient) the same. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* LAPACK (OpenBLAS's), Fortran calling convention, column-major. */
void dsyevr_(const char *jobz, const char *range, const char *uplo, const int *n, double *a, const int *lda,
             const double *vl, const double *vu, const int *il, const int *iu, const double *abstol, int *m,
             double *w, double *z, const int *ldz, int *isuppz, double *work, const int *lwork, int *iwork,
             const int *liwork, int *info);
void sgeqrf_(const int *m, const int *n, float *a, const int *lda, float *tau, float *work, const int *lwork,
             int *info);
void sormqr_(const char *side, const char *trans, const int *m, const int *n, const int *k, const float *a,
             const int *lda, const float *tau, float *c, const int *ldc, float *work, const int *lwork,
             int *info);

/* PiSSA of W [OUT, IN] (row major): A [r, IN], B [OUT, r]. The top r singular triplets only, from the
 * eigenvectors of the smaller Gram matrix in float64 (W W^T or W^T W: dsyrk + dsyevr for its r largest
 * eigenvalues), the other side's vectors W^T v / S or W u / S: the same triplets as the float32 full
 * SVD PEFT runs (within its own rounding, ~1e-6) at a fraction of the arithmetic. A zero singular value
 * gives a zero row of A and column of B, as sqrt(0) does in PEFT's. */
static ctrl_status pissa(const float *W, int OUT, int IN, int r, float s, float *A, float *B) {
    const int left = OUT <= IN, n = left ? OUT : IN; /* left: the Gram is W W^T, its vectors W's left ones */
    double *w = malloc(sizeof(double) * (size_t)OUT * IN), *g = malloc(sizeof(double) * (size_t)n * n),
           *lam = malloc(sizeof(double) * (size_t)n), *z = malloc(sizeof(double) * (size_t)n * r);
    int *isuppz = malloc(sizeof(int) * 2 * (size_t)r), info = 0, found = 0, lwork = -1, liwork = -1, iq = 0;
    double wq = 0, *work = NULL;
    int *iwork = NULL;
    ctrl_status st = w && g && lam && z && isuppz ? CTRL_OK : CTRL_ERR_NOMEM;
    if (st == CTRL_OK) {
        for (size_t i = 0; i < (size_t)OUT * IN; i++) w[i] = W[i];
        /* row-major W [OUT, IN]: W W^T = w w^T (NoTrans), W^T W (Trans); the lower triangle, row major =
         * the upper one column major */
        cblas_dsyrk(CblasRowMajor, CblasLower, left ? CblasNoTrans : CblasTrans, n, left ? IN : OUT, 1.0, w,
                    IN, 0.0, g, n);
        const int il = n - r + 1, iu = n;
        const double zero = 0;
        dsyevr_("V", "I", "U", &n, g, &n, &zero, &zero, &il, &iu, &zero, &found, lam, z, &n, isuppz, &wq,
                &lwork, &iq, &liwork, &info);
        lwork = (int)wq + 1, liwork = iq + 1;
        work = malloc(sizeof(double) * (size_t)lwork), iwork = malloc(sizeof(int) * (size_t)liwork);
        if (!work || !iwork) st = CTRL_ERR_NOMEM;
        if (st == CTRL_OK)
            dsyevr_("V", "I", "U", &n, g, &n, &zero, &zero, &il, &iu, &zero, &found, lam, z, &n, isuppz, work,
                    &lwork, iwork, &liwork, &info);
        if (st == CTRL_OK && (info != 0 || found != r))
            st = ctrl_error_set(CTRL_ERR_RUNTIME,
                                "PiSSA: the eigenvectors of a [%d, %d] Gram matrix (dsyevr info %d)", n, n,
                                info);
    }
    /* the other side's vectors unnormalised: W^T V [IN, r] (left) or W U [OUT, r], into g (n x n >= that) */
    const int other = left ? IN : OUT;
    double *wv = st == CTRL_OK ? malloc(sizeof(double) * (size_t)other * r) : NULL;
    if (st == CTRL_OK && !wv) st = CTRL_ERR_NOMEM;
    if (st == CTRL_OK) /* z: column-major [n, r] = row-major [r, n]: wv[x][c] = sum_k W(.)[x][k] z[c][k] */
        cblas_dgemm(CblasRowMajor, left ? CblasTrans : CblasNoTrans, CblasTrans, other, r, n, 1.0, w, IN, z,
                    n, 0.0, wv, r);
    for (int j = 0; st == CTRL_OK && j < r; j++) { /* component j: eigenvalue r - 1 - j (ascending) */
        const int c = r - 1 - j;
        const double *v = z + (size_t)c * n, sv = sqrt(fmax(lam[c], 0));
        const double gj = sv > 1e-30 ? sqrt(sv / s) : 0; /* a zero singular value: zeros, as PEFT's sqrt(0) */
        const double inv = sv > 1e-30 ? 1 / sv : 0;
        for (int o = 0; o < OUT; o++)
            B[(size_t)o * r + j] = (float)((left ? v[o] : wv[(size_t)o * r + c] * inv) * gj);
        for (int i = 0; i < IN; i++)
            A[(size_t)j * IN + i] = (float)((left ? wv[(size_t)i * r + c] * inv : v[i]) * gj);
    }
    free(wv);
    free(w), free(g), free(lam), free(z), free(isuppz), free(work), free(iwork);
    return st == CTRL_ERR_NOMEM
               ? ctrl_error_set(st, "PiSSA: the singular vectors of a [%d, %d] weight", OUT, IN)
               : st;
}

/* OLoRA of W [OUT, IN] (row major): A = R[:r] [r, IN], B = Q[:, :r] [OUT, r], W = Q R. Only the first r
 * Householder reflectors matter (they are W's first r columns' QR): sgeqrf of those columns, the
 * reflectors applied to W (sormqr) for R's first r rows and to the identity's first r columns for Q's. */
static ctrl_status olora(const float *W, int OUT, int IN, int r, float *A, float *B) {
    const int m = OUT;
    float *a = malloc(sizeof(float) * (size_t)m * IN), *q = calloc((size_t)m * r, sizeof(float)),
          *tau = malloc(sizeof(float) * (size_t)r), *work = NULL;
    int info = 0, lwork = -1;
    float query = 0;
    ctrl_status st = a && q && tau ? CTRL_OK : CTRL_ERR_NOMEM;
    for (int o = 0; st == CTRL_OK && o < OUT; o++) /* column-major W [OUT, IN] */
        for (int i = 0; i < IN; i++) a[o + (size_t)i * m] = W[(size_t)o * IN + i];
    if (st == CTRL_OK) {
        sgeqrf_(&m, &r, a, &m, tau, &query, &lwork, &info);
        lwork = (int)query + 64 * (IN > r ? IN : r) + 1;
        if (!(work = malloc(sizeof(float) * (size_t)lwork))) st = CTRL_ERR_NOMEM;
    }
    if (st == CTRL_OK) sgeqrf_(&m, &r, a, &m, tau, work, &lwork, &info); /* the first r columns */
    const int rest = IN - r;
    if (st == CTRL_OK && info == 0 && rest > 0) /* Q^T applied to the other columns: R's rows there */
        sormqr_("L", "T", &m, &rest, &r, a, &m, tau, a + (size_t)r * m, &m, work, &lwork, &info);
    for (int j = 0; st == CTRL_OK && j < r; j++) q[j + (size_t)j * m] = 1.0f;
    if (st == CTRL_OK && info == 0) sormqr_("L", "N", &m, &r, &r, a, &m, tau, q, &m, work, &lwork, &info);
    if (st == CTRL_OK && info != 0)
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "OLoRA: the QR failed (info %d)", info);
    for (int j = 0; st == CTRL_OK && j < r; j++) /* R's first r rows (upper triangular in the first r) */
        for (int i = 0; i < IN; i++) A[(size_t)j * IN + i] = i >= j ? a[j + (size_t)i * m] : 0.0f;
    for (int o = 0; st == CTRL_OK && o < OUT; o++)
        for (int j = 0; j < r; j++) B[(size_t)o * r + j] = q[o + (size_t)j * m];
    free(a), free(q), free(tau), free(work);
    return st == CTRL_ERR_NOMEM ? ctrl_error_set(st, "OLoRA: the QR of a [%d, %d] weight", OUT, IN) : st;
}

int lora_init_from_base_on(const ctrl_lora_config *c) {
    return c && (c->init == CTRL_LORA_INIT_PISSA || c->init == CTRL_LORA_INIT_OLORA);
}

ctrl_status lora_init_from_base(ctrl_model *m, const ctrl_param_view *v) {
    if (!m->has_lora || !lora_init_from_base_on(m->lora) || v->lora || v->ndim != 2) return CTRL_OK;
    int l = -1;
    if (sscanf(v->name, "model.layers.%d.", &l) != 1 || l < 0 || l >= m->cfg.n_layers) return CTRL_OK;
    for (int t = 0; t < LORA_N_TARGETS; t++) { /* the module whose (whole) base weight v is */
        long w, bias;
        int row0, OUT, IN, slot_out;
        lora_base_weight(m, l, t, &w, &bias);
        lora_module(m, t, &row0, &OUT);
        if (w != (long)v->offset || row0 != 0 || m->lora_a[l * LORA_N_TARGETS + t] < 0) continue;
        lora_dims(m, t, &IN, &slot_out);
        if ((int64_t)OUT * IN != v->numel) continue;
        const int r = lora_r(m, l, t);
        const float s = lora_s(m, l, t);
        if (!(s > 0) && m->lora->init == CTRL_LORA_INIT_PISSA) /* PiSSA divides the singular values by s */
            return ctrl_error_set(CTRL_ERR_CONFIG, "LoRA PiSSA: %s's scale is %g; it needs lora_alpha > 0",
                                  v->name, (double)s);
        if (r > (OUT < IN ? OUT : IN))
            return ctrl_error_set(CTRL_ERR_CONFIG, "LoRA %s: r = %d exceeds the rank of %s [%d, %d]",
                                  m->lora->init == CTRL_LORA_INIT_PISSA ? "PiSSA" : "OLoRA", r, v->name, OUT,
                                  IN);
        float *W = m->params + v->offset, *A = m->params + m->lora_a[l * LORA_N_TARGETS + t],
              *B = m->params + m->lora_b[l * LORA_N_TARGETS + t];
        MODEL_TRY(m->lora->init == CTRL_LORA_INIT_PISSA ? pissa(W, OUT, IN, r, s, A, B)
                                                        : olora(W, OUT, IN, r, A, B));
        for (int o = 0; o < OUT; o++) /* the residual: W -= s (B A), B A first as PEFT's matmul */
            for (int i = 0; i < IN; i++) {
                float ba = 0;
                for (int j = 0; j < r; j++) ba += B[(size_t)o * r + j] * A[(size_t)j * IN + i];
                W[(size_t)o * IN + i] -= s * ba;
            }
        m->lora_from_base_done++;
        return CTRL_OK;
    }
    return CTRL_OK;
}

ctrl_status lora_init_from_base_check(ctrl_model *m) {
    int want = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            int row0, out;
            lora_module(m, t, &row0, &out);
            want += row0 == 0 && m->lora_a[l * LORA_N_TARGETS + t] >= 0;
        }
    if (m->lora_from_base_done != want)
        return ctrl_error_set(
            CTRL_ERR_RUNTIME, "LoRA init_lora_weights = %s: %d of %d adapters found their base weight",
            m->lora->init == CTRL_LORA_INIT_PISSA ? "pissa" : "olora", m->lora_from_base_done, want);
    ctrl_model_weights_changed(m);
    return CTRL_OK;
}
