/* PEFT's initialisations that read the base weight and change it (peft 0.21, tuners/lora/layer.py),
 * run on each adapted projection weight as it loads in fp32, before it is narrowed to bf16 or NF4:
 *   pissa  (pissa_init)  W = V S U^T (float32 SVD, LAPACK sgesdd as torch.linalg.svd on the CPU):
 *          A = sqrt(S_r / s) U_r^T, B = V_r sqrt(S_r / s), and W -= s B A (the residual keeps the rest);
 *   olora  (olora_init)  W = Q R (float32 Householder QR, LAPACK sgeqrf + sorgqr as torch.linalg.qr):
 *          A = R[:r], B = Q[:, :r], and W -= s B A;
 * s the module's scaling (alpha / r, rank_pattern / alpha_pattern included). An adapter PEFT saved so
 * (its adapter_config.json says pissa or olora) is loaded the same way: the residual recomputed from
 * the original base, then A and B replaced by the file's, as PeftModel.from_pretrained does. A
 * singular vector's sign is LAPACK's choice: A's row j and B's column j may both be negated against
 * torch's, which leaves B A, the residual and training (AdamW is odd in the gradient) the same. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* LAPACK (OpenBLAS's), Fortran calling convention, column-major. */
void sgesdd_(const char *jobz, const int *m, const int *n, float *a, const int *lda, float *s, float *u,
             const int *ldu, float *vt, const int *ldvt, float *work, const int *lwork, int *iwork,
             int *info);
void sgeqrf_(const int *m, const int *n, float *a, const int *lda, float *tau, float *work, const int *lwork,
             int *info);
void sorgqr_(const int *m, const int *n, const int *k, float *a, const int *lda, const float *tau,
             float *work, const int *lwork, int *info);

/* PiSSA of W [OUT, IN] (row major): A [r, IN], B [OUT, r]. */
static ctrl_status pissa(const float *W, int OUT, int IN, int r, float s, float *A, float *B) {
    /* row-major W is column-major W^T [IN, OUT] = U' S V'^T: W = V' S U'^T, so W's right singular
     * vectors are U''s columns and its left ones V''s rows (VT' [k, OUT]) */
    const int m = IN, n = OUT, k = IN < OUT ? IN : OUT;
    float *a = malloc(sizeof(float) * (size_t)m * n), *sv = malloc(sizeof(float) * (size_t)k),
          *u = malloc(sizeof(float) * (size_t)m * k), *vt = malloc(sizeof(float) * (size_t)k * n);
    int *iwork = malloc(sizeof(int) * 8 * (size_t)k), info = 0, lwork = -1;
    float query = 0, *work = NULL;
    ctrl_status st = a && sv && u && vt && iwork ? CTRL_OK : CTRL_ERR_NOMEM;
    if (st == CTRL_OK) {
        memcpy(a, W, sizeof(float) * (size_t)m * n);
        sgesdd_("S", &m, &n, a, &m, sv, u, &m, vt, &k, &query, &lwork, iwork, &info);
        lwork = (int)query + 1;
        if (!(work = malloc(sizeof(float) * (size_t)lwork))) st = CTRL_ERR_NOMEM;
    }
    if (st == CTRL_OK) sgesdd_("S", &m, &n, a, &m, sv, u, &m, vt, &k, work, &lwork, iwork, &info);
    if (st == CTRL_OK && info != 0)
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "PiSSA: the SVD failed (sgesdd info %d)", info);
    for (int j = 0; st == CTRL_OK && j < r; j++) {
        const float g = sqrtf(sv[j] / s);
        for (int i = 0; i < IN; i++) A[(size_t)j * IN + i] = g * u[(size_t)j * m + i];
        for (int o = 0; o < OUT; o++) B[(size_t)o * r + j] = vt[j + (size_t)o * k] * g;
    }
    free(a), free(sv), free(u), free(vt), free(iwork), free(work);
    return st == CTRL_ERR_NOMEM ? ctrl_error_set(st, "PiSSA: the SVD of a [%d, %d] weight", OUT, IN) : st;
}

/* OLoRA of W [OUT, IN] (row major): A = R[:r] [r, IN], B = Q[:, :r] [OUT, r]. */
static ctrl_status olora(const float *W, int OUT, int IN, int r, float *A, float *B) {
    const int m = OUT, n = IN, k = OUT < IN ? OUT : IN;
    float *a = malloc(sizeof(float) * (size_t)m * n), *tau = malloc(sizeof(float) * (size_t)k), *work = NULL;
    int info = 0, lwork = -1;
    float query = 0;
    ctrl_status st = a && tau ? CTRL_OK : CTRL_ERR_NOMEM;
    for (int o = 0; st == CTRL_OK && o < OUT; o++) /* column-major W [OUT, IN] */
        for (int i = 0; i < IN; i++) a[o + (size_t)i * m] = W[(size_t)o * IN + i];
    if (st == CTRL_OK) {
        sgeqrf_(&m, &n, a, &m, tau, &query, &lwork, &info);
        lwork = (int)query + 1 + 64 * n;
        if (!(work = malloc(sizeof(float) * (size_t)lwork))) st = CTRL_ERR_NOMEM;
    }
    if (st == CTRL_OK) sgeqrf_(&m, &n, a, &m, tau, work, &lwork, &info);
    for (int j = 0; st == CTRL_OK && info == 0 && j < r; j++) /* R's first r rows (upper triangle) */
        for (int i = 0; i < IN; i++) A[(size_t)j * IN + i] = i >= j ? a[j + (size_t)i * m] : 0.0f;
    if (st == CTRL_OK && info == 0) sorgqr_(&m, &k, &k, a, &m, tau, work, &lwork, &info); /* Q [OUT, k] */
    if (st == CTRL_OK && info != 0)
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "OLoRA: the QR failed (info %d)", info);
    for (int o = 0; st == CTRL_OK && o < OUT; o++)
        for (int j = 0; j < r; j++) B[(size_t)o * r + j] = a[o + (size_t)j * m];
    free(a), free(tau), free(work);
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
