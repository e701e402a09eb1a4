/* LoRA's frozen embedding held as bf16 values alone ([peft] embedding_dtype = bf16,
 * core/model/model_embed16.c; kernels/cpu/embedding.c). Over the tied Qwen2 fixture and PEFT's
 * fixture adapter (tests/fixtures/lora/qwen2_attn_mlp), under bf16 compute with the base held in
 * bf16 as ctrl's LoRA runs do:
 *   - the lookups return the fp32 rows rounded to bf16, and nothing else changes: two training steps
 *     (the adapters changed between them) give bit for bit the log-probs and adapter gradients of the
 *     same model whose fp32 table holds the rounded values (the tied head multiplies by the same bf16
 *     values; tolerance 1e-6 on the portable path, where the head's SGEMM runs in blocks);
 *   - against the fp32 table (the default) the log-probs and loss stay within the bf16 tolerance the
 *     project holds against transformers under torch.autocast (1e-2 relative, test_model_parity.c),
 *     and the adapter gradients within its criterion for two independent bf16 roundings (twice bf16
 *     compute's own distance from fp32 compute, measured here: rounding the lookups moves these
 *     small random adapters' gradients 1.5e-2 / 2.8e-2 over two steps where bf16 compute itself
 *     moves them 1.1e-2 / 1.8e-2); the gradients have the same tensors (nothing more trains);
 *   - with fresh adapters (B = 0: the base's function) the log-probs are within 1e-2 of transformers'
 *     own under autocast (tests/fixtures/models/qwen2/batch_bf16.json);
 *   - decoding (the lookup and the tied head's logits from the bf16 table) gives the training
 *     forward's log-probs, and the rounded-fp32 model's decoded ones;
 *   - ctrl_model_param_bytes counts the table in 2 bytes a value, or where a bf16 kernel runs as the
 *     tied head's panels (its only copy: the lookups read rows out of them; ctest runs it again with
 *     CTRL_NO_EMBED_PANELS=1, the values form, and the numbers above are the same bit for bit);
 *   - the head's statistics (the sequence trainers' mean logits, log sum p^2) equal the rounded
 *     table's;
 *   - refused: a trained table (modules_to_save embed_tokens), fp32 compute afterwards. The config
 *     refusals are test_config_errors.c's.
 * The kernels: ctrl_cpu_embedding_forward_bf16 equals rounding the gathered rows; ctrl_cpu_gemm_w16
 * equals ctrl_cpu_gemm_bf16 on the widened values (bit for bit where a bf16 kernel runs). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_ops.h"
#include "model/json_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/peft.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"

static ctrl_registry *reg; /* the plugins' registry: kept (the models use its plugins' ops) */

static const ctrl_attention_ops *eager(void) {
    const ctrl_plugin *p = NULL;
    if (!reg) reg = test_plugin_registry();
    CHECK_EQ_INT(ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "eager", &p), CTRL_OK);
    return p ? p->ops : NULL;
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static int rounding_is_exact(void) { return ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32; }

TEST(embedding_bf16_lookup_is_the_rounded_rows) {
    const int V = 37, C = 50, T = 9;
    float *w = malloc(sizeof(float) * V * C), *r = malloc(sizeof(float) * V * C),
          *got = malloc(sizeof(float) * T * C), *want = malloc(sizeof(float) * T * C);
    uint16_t *w16 = malloc(sizeof(uint16_t) * V * C);
    for (int i = 0; i < V * C; i++) w[i] = frand() * 3.0f;
    const int32_t tok[9] = {0, 36, 5, 5, 17, 2, 36, 11, 30};
    ctrl_cpu_f32_to_bf16(w16, w, V * C);
    ctrl_cpu_round_to_bf16(r, w, V * C);
    ctrl_cpu_embedding_forward_bf16(got, tok, w16, T, C);
    ctrl_cpu_embedding_forward(want, tok, r, T, C);
    CHECK(!memcmp(got, want, sizeof(float) * T * C));
    free(w), free(r), free(got), free(want), free(w16);
}

/* ctrl_cpu_gemm_w16 against ctrl_cpu_gemm_bf16 (bf16) or SGEMM-equivalent sums (fp32) on the widened B. */
static void gemm_case(int M, int N, int K, int trans_b, int accumulate, float alpha) {
    const int rows = trans_b ? N : K, len = trans_b ? K : N;
    float *a = malloc(sizeof(float) * M * K), *ar = malloc(sizeof(float) * M * K),
          *b = malloc(sizeof(float) * rows * len), *c1 = malloc(sizeof(float) * M * N),
          *c2 = malloc(sizeof(float) * M * N);
    uint16_t *b16 = malloc(sizeof(uint16_t) * rows * len);
    for (int i = 0; i < M * K; i++) a[i] = frand();
    ctrl_cpu_round_to_bf16(ar, a, M * K);
    for (int i = 0; i < rows * len; i++) b[i] = frand();
    ctrl_cpu_f32_to_bf16(b16, b, rows * len);
    ctrl_cpu_bf16_to_f32(b, b16, rows * len);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (int i = 0; i < M * N; i++) c1[i] = c2[i] = frand();
        CHECK_EQ_INT(ctrl_cpu_gemm_w16(0, trans_b, M, N, K, alpha, a, K, b16, len, c1, N, accumulate, bf16),
                     0);
        int exact = 0;
        if (bf16 && ctrl_cpu_gemm_bf16(0, trans_b, M, N, K, a, K, b, len, c2, N, accumulate) == 0) {
            for (int i = 0; i < M * N && alpha != 1.0f; i++) c2[i] *= alpha;
            exact = 1;
        } else { /* the sums in double */
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)(bf16 ? ar : a)[i * K + k] * (trans_b ? b[j * K + k] : b[k * N + j]);
                    c2[i * N + j] = (float)(alpha * s + (accumulate ? c2[i * N + j] : 0.0));
                }
        }
        const double e = test_rel_error_f32(c1, c2, M * N);
        if (exact)
            CHECK_MSG(!memcmp(c1, c2, sizeof(float) * M * N),
                      "M %d N %d K %d tb %d: not bit for bit (rel %.3g)", M, N, K, trans_b, e);
        else
            CHECK_MSG(e <= (bf16 ? 1e-2 : 1e-5), "M %d N %d K %d tb %d bf16 %d: rel %.3g", M, N, K, trans_b,
                      bf16, e);
    }
    free(a), free(ar), free(b), free(c1), free(c2), free(b16);
}

TEST(gemm_w16_is_the_bf16_gemm_on_the_widened_values) {
    gemm_case(37, 300, 64, 1, 0, 1.0f);  /* the head's logits: x W^T */
    gemm_case(3, 300, 64, 1, 0, 0.5f);   /* a few rows: unpacked, in blocks */
    gemm_case(37, 64, 300, 0, 0, 1.0f);  /* dX = dZ W */
    gemm_case(21, 64, 300, 0, 1, 1.0f);  /* accumulating */
    gemm_case(5, 4700, 900, 1, 0, 1.0f); /* more rows of B than one widened block: N split */
    gemm_case(9, 896, 4000, 0, 1, 1.0f); /* K split at whole depth blocks */
    gemm_case(37, 300, 63, 1, 0, 0.5f);  /* an odd depth: the last pair's high half 0 */
    gemm_case(37, 45, 301, 0, 0, 1.0f);  /* an odd depth of [K, N] rows, N not a multiple of 16 */
}

/* qwen2's tied model with PEFT's fixture adapter (or fresh adapters: B = 0), the base in bf16 as a
 * LoRA run holds it; embed16: the table in bf16; rounded: the fp32 table holding rounded values. */
static ctrl_model *load_from(const char *name, int embed16, int rounded, int fresh, int save_embed, int fp32,
                             ctrl_status *status) {
    char adapter[1024], base[512], dir[1600];
    snprintf(adapter, sizeof adapter, "%s/lora/%s", CTRL_FIXTURE_DIR, name);
    ctrl_lora_config lc;
    ctrl_model *m = NULL;
    ctrl_status st = ctrl_peft_read_config(adapter, &lc, base, sizeof base);
    if (st == CTRL_OK && fresh) lc.init = CTRL_LORA_INIT_DEFAULT;
    snprintf(dir, sizeof dir, "%s/%s", CTRL_FIXTURE_DIR, base);
    lc.bf16_base = !fp32, lc.bf16_embed = embed16, lc.save_embed_tokens = save_embed;
    if (st == CTRL_OK) st = ctrl_model_load_lora(dir, eager(), &lc, &m);
    if (st == CTRL_OK && !fresh) st = ctrl_peft_load_weights(m, adapter);
    if (st == CTRL_OK) st = ctrl_model_set_compute_dtype(m, fp32 ? CTRL_F32 : CTRL_BF16);
    for (int v = 0; st == CTRL_OK && rounded && v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        float *p = ctrl_model_params(m, NULL) + pv->offset;
        if (!strcmp(pv->name, "model.embed_tokens.weight")) ctrl_cpu_round_to_bf16(p, p, pv->numel);
    }
    if (status) *status = st;
    if (st != CTRL_OK) {
        ctrl_model_free(m);
        return NULL;
    }
    test_attach_paged(m);
    return m;
}

static ctrl_model *load(int embed16, int rounded, int fresh, int save_embed, ctrl_status *status) {
    return load_from("qwen2_attn_mlp", embed16, rounded, fresh, save_embed, 0, status);
}

typedef struct batch_file {
    int T;
    int32_t *tok, *pos, *tg, *cu;
    ctrl_batch b;
} batch_file;

static batch_file read_batch(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/qwen2/batch.json", CTRL_FIXTURE_DIR);
    cJSON *root = json_file(path);
    batch_file f = {0};
    int n, n_cu = 0;
    f.tok = json_ints(root, "tokens", &f.T), f.pos = json_ints(root, "positions", &n);
    f.tg = json_ints(root, "targets", &n), f.cu = json_ints(root, "cu_seqlens", &n_cu);
    cJSON_Delete(root);
    f.b = (ctrl_batch){
        .T = f.T, .B = n_cu - 1, .tokens = f.tok, .positions = f.pos, .cu_seqlens = f.cu, .targets = f.tg};
    return f;
}

static void batch_free(batch_file *f) { free(f->tok), free(f->pos), free(f->tg), free(f->cu); }

static double mean_nll(const float *lp, const int32_t *tg, int T) {
    double s = 0;
    int n = 0;
    for (int t = 0; t < T; t++)
        if (tg[t] >= 0) s -= lp[t], n++;
    return n ? s / n : 0;
}

TEST(lora_embedding_in_bf16_changes_only_the_lookups) {
    batch_file f = read_batch();
    const int T = f.T;
    /* 0: the table in bf16; 1: fp32 holding the rounded values; 2: fp32 (the default); 3: fp32 compute */
    ctrl_model *m[4] = {load(1, 0, 0, 0, NULL), load(0, 1, 0, 0, NULL), load(0, 0, 0, 0, NULL),
                        load_from("qwen2_attn_mlp", 0, 0, 0, 0, 1, NULL)};
    if (!m[0] || !m[1] || !m[2] || !m[3] || T <= 0) {
        CHECK_MSG(0, "loading: %s", ctrl_error_message());
        goto done;
    }
    CHECK(ctrl_model_embedding_held_bf16(m[0]) && !ctrl_model_embedding_held_bf16(m[2]));
    const ctrl_model_config *c = ctrl_model_cfg(m[0]);
    const size_t table = (size_t)c->vocab_size * (size_t)c->hidden_size;
    /* as the tied head's panels where a bf16 kernel runs (unless switched off), else as bf16 values */
    const char *no_panels = getenv("CTRL_NO_EMBED_PANELS");
    const int panels = rounding_is_exact() && !(no_panels && *no_panels && strcmp(no_panels, "0") != 0);
    const size_t held = panels ? ctrl_cpu_gemm_bf16_pack_bytes(c->vocab_size, c->hidden_size) : 2 * table;
    CHECK_MSG(ctrl_model_param_bytes(m[0]) + 4 * table - held == ctrl_model_param_bytes(m[2]),
              "parameters %zu bytes, fp32 table %zu (the table held as %s)", ctrl_model_param_bytes(m[0]),
              ctrl_model_param_bytes(m[2]), panels ? "panels" : "values");
    printf("  the table held as %s: %zu bytes (fp32: %zu)\n", panels ? "the head's panels" : "bf16 values",
           held, 4 * table);
    float *lp[4], *dlogp = calloc((size_t)T, 4);
    for (int k = 0; k < 4; k++) lp[k] = calloc((size_t)T, 4);
    for (int t = 0; t < T; t++) dlogp[t] = f.tg[t] >= 0 ? -0.05f : 0.0f;
    const double exact_tol = rounding_is_exact() ? 0.0 : 1e-6;
    for (int step = 0; step < 2; step++) {
        size_t ng[4] = {0, 0, 0, 0};
        float *g[4];
        for (int k = 0; k < 4; k++) {
            ctrl_model_set_training(m[k], 1, (uint64_t)step + 3);
            CHECK_EQ_INT(ctrl_model_zero_grad(m[k]), CTRL_OK);
            CHECK_EQ_INT(ctrl_model_forward_fused(m[k], &f.b, dlogp, lp[k], NULL, NULL), CTRL_OK);
            CHECK_EQ_INT(ctrl_model_backward(m[k], NULL), CTRL_OK);
            g[k] = (float *)ctrl_model_grads(m[k], &ng[k]);
        }
        CHECK(ng[0] > 0 && ng[0] == ng[1] && ng[0] == ng[2]); /* the same trained tensors */
        CHECK(ctrl_model_trainable_offset(m[0]) == ctrl_model_trainable_offset(m[2]));
        const double e_lp = test_rel_error_f32(lp[0], lp[1], T),
                     e_g = test_rel_error_f32(g[0], g[1], (long)ng[0]);
        CHECK_MSG(e_lp <= exact_tol && e_g <= exact_tol,
                  "step %d vs the rounded fp32 table: logp %.3g, grads %.3g", step, e_lp, e_g);
        const double d_lp = test_rel_error_f32(lp[0], lp[2], T),
                     d_g = test_rel_error_f32(g[0], g[2], (long)ng[0]);
        const double l0 = mean_nll(lp[0], f.tg, T), l2 = mean_nll(lp[2], f.tg, T);
        /* bf16's own distance: the default bf16 run's gradients from fp32 compute's */
        const double floor_g = ng[3] == ng[2] ? test_rel_error_f32(g[2], g[3], (long)ng[2]) : 1.0;
        CHECK_MSG(d_lp <= 1e-2 && fabs(l0 - l2) <= 1e-2 * fabs(l2) && d_g <= fmax(1e-2, 2 * floor_g),
                  "step %d vs the fp32 table: logp %.3g, loss %.7f vs %.7f, grads %.3g (bf16 vs fp32: %.3g)",
                  step, d_lp, l0, l2, d_g, floor_g);
        CHECK_MSG(d_lp > 0, "step %d: the rounded lookups changed nothing", step); /* really rounded */
        printf("  step %d: vs rounded fp32 table logp %.1e grads %.1e; vs fp32 table logp %.1e, loss %.7f vs "
               "%.7f, grads %.1e (bf16 compute vs fp32: %.1e)\n",
               step, e_lp, e_g, d_lp, l0, l2, d_g, floor_g);
        for (int k = 0; k < 4; k++) { /* an optimizer's step on the adapters, the same on all */
            size_t n = 0;
            float *p = ctrl_model_params(m[k], &n);
            const size_t off = ctrl_model_trainable_offset(m[k]);
            for (size_t i = off; i < n; i++) p[i] -= 0.5f * g[k][i - off];
            ctrl_model_weights_changed(m[k]);
        }
    }
    /* decoding: the lookups and the tied head's logits from the bf16 table */
    ctrl_model_set_training(m[0], 0, 0), ctrl_model_set_training(m[1], 0, 0);
    static const int32_t seq[] = {3, 17, 42, 99, 5, 64, 11, 23, 88, 7};
    const int n = (int)(sizeof seq / sizeof *seq), V = c->vocab_size;
    int32_t tok[16], pos[16], tg[16], cu[2] = {0, n};
    for (int i = 0; i < n; i++) tok[i] = seq[i] % V, pos[i] = i;
    for (int i = 0; i < n; i++) tg[i] = i + 1 < n ? tok[i + 1] : -100;
    const ctrl_batch b = {.T = n, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float fwd[16], dec[2][16], *logits = malloc(sizeof(float) * (size_t)V);
    CHECK_EQ_INT(ctrl_model_forward(m[0], &b, fwd, NULL, NULL), CTRL_OK);
    for (int k = 0; k < 2; k++) {
        ctrl_kv_cache *kv = NULL;
        CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                     CTRL_OK);
        ctrl_kv_seq s = {0}, *seqs[1] = {&s};
        for (int i = 0; kv && i + 1 < n; i++) {
            int one = 1;
            CHECK_EQ_INT(ctrl_model_decode(m[k], kv, seqs, tok + i, &one, 1, logits), CTRL_OK);
            double mx = -INFINITY, z = 0;
            for (int v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            for (int v = 0; v < V; v++) z += exp(logits[v] - mx);
            dec[k][i] = (float)(logits[tok[i + 1]] - mx - log(z));
        }
        if (kv) ctrl_kv_seq_release(kv, &s), ctrl_kv_cache_free(kv);
    }
    const double e_dec = test_rel_error_f32(dec[0], fwd, n - 1),
                 e_r = test_rel_error_f32(dec[0], dec[1], n - 1);
    CHECK_MSG(e_dec <= 1e-2 && e_r <= 1e-5, "decoding: vs the forward %.3g, vs the rounded fp32 table %.3g",
              e_dec, e_r);
    printf("  decoding: vs the forward logp %.1e, vs the rounded fp32 table %.1e\n", e_dec, e_r);
    /* the head's statistics (DPO/KTO's mean logits, WPO's log sum p^2) read the same bf16 values */
    float ml[2][16], ls[2][16];
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(ctrl_model_forward(m[k], &b, fwd, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_head_stats(m[k], ml[k], ls[k]), CTRL_OK);
    }
    const double e_ml = test_rel_error_f32(ml[0], ml[1], n), e_ls = test_rel_error_f32(ls[0], ls[1], n);
    CHECK_MSG(e_ml <= exact_tol && e_ls <= exact_tol, "head statistics: mean logits %.3g, log sum p^2 %.3g",
              e_ml, e_ls);
    /* refused: fp32 compute would need the fp32 table given back */
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m[0], CTRL_F32), CTRL_ERR_UNSUPPORTED);
    free(logits), free(dlogp);
    for (int k = 0; k < 4; k++) free(lp[k]);
done:
    for (int k = 0; k < 4; k++) ctrl_model_free(m[k]);
    batch_free(&f);
}

TEST(lora_embedding_in_bf16_within_autocast_tolerance) {
    batch_file f = read_batch();
    char path[1024];
    snprintf(path, sizeof path, "%s/models/qwen2/batch_bf16.json", CTRL_FIXTURE_DIR);
    cJSON *root = json_file(path);
    int n = 0;
    float *want = NULL;
    if (root) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "logp");
        n = cJSON_GetArraySize(a);
        want = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        for (int i = 0; i < n; i++) want[i] = (float)cJSON_GetArrayItem(a, i)->valuedouble;
    }
    const double want_loss = root ? cJSON_GetObjectItemCaseSensitive(root, "loss")->valuedouble : 0;
    ctrl_model *m = load(1, 0, 1, 0, NULL); /* fresh adapters: B = 0, the base's function */
    CHECK(m && want && n == f.T);
    if (m && want && n == f.T) {
        float *lp = calloc((size_t)n, 4);
        CHECK_EQ_INT(ctrl_model_forward(m, &f.b, lp, NULL, NULL), CTRL_OK);
        const double e = test_rel_error_f32(lp, want, n), loss = mean_nll(lp, f.tg, n);
        CHECK_MSG(e <= 1e-2 && fabs(loss - want_loss) <= 1e-2 * fabs(want_loss),
                  "vs transformers under autocast: logp %.3g, loss %.7f vs %.7f", e, loss, want_loss);
        printf("  vs transformers under autocast: logp rel %.1e, loss %.6f (autocast %.6f)\n", e, loss,
               want_loss);
        free(lp);
    }
    ctrl_model_free(m);
    cJSON_Delete(root), free(want);
    batch_free(&f);
}

TEST(lora_embedding_in_bf16_untied_or_refused_when_trained) {
    ctrl_status st = CTRL_OK;
    /* Llama's fixture is untied: the table in bf16, its own LM head fp32 */
    ctrl_model *m = load_from("llama_qv", 1, 0, 1, 1, 0, &st); /* modules_to_save = embed_tokens */
    CHECK(m == NULL && st == CTRL_ERR_CONFIG);
    CHECK(strstr(ctrl_error_message(), "modules_to_save") != NULL);
    ctrl_model_free(m);
    ctrl_error_clear();
    ctrl_model *u[2] = {load_from("llama_qv", 1, 0, 0, 0, 0, NULL),
                        load_from("llama_qv", 0, 1, 0, 0, 0, NULL)};
    CHECK(u[0] && u[1] && ctrl_model_embedding_held_bf16(u[0]));
    if (u[0] && u[1]) { /* the untied head reads its own fp32 weight: the same log-probs as rounded rows */
        static const int32_t seq[] = {3, 17, 42, 99, 5, 64, 11, 23};
        int32_t tok[8], pos[8], tg[8], cu[2] = {0, 8};
        const int V = ctrl_model_cfg(u[0])->vocab_size;
        for (int i = 0; i < 8; i++) tok[i] = seq[i] % V, pos[i] = i;
        for (int i = 0; i < 8; i++) tg[i] = i + 1 < 8 ? tok[i + 1] : -100;
        const ctrl_batch b = {
            .T = 8, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
        float lp[2][8];
        for (int k = 0; k < 2; k++) CHECK_EQ_INT(ctrl_model_forward(u[k], &b, lp[k], NULL, NULL), CTRL_OK);
        CHECK(!memcmp(lp[0], lp[1], sizeof lp[0]));
        CHECK_EQ_INT(ctrl_model_head_stats(u[0], lp[0], NULL), CTRL_OK); /* the head is not the table */
    }
    ctrl_model_free(u[0]), ctrl_model_free(u[1]);
}

/* Server mode's push of a LoRA model whose table is held in bf16 (ctrl_peft_save_merged_weights): the
 * table goes into the file as it is held, a BF16 tensor (no widened fp32 copy of it is made), and every
 * tensor read back as fp32 equals, bit for bit, the file of the same model whose fp32 table holds the
 * rounded values (where the base is the bf16 GEMM's panels the push is refused: test_lora's case). */
TEST(lora_merged_file_keeps_the_bf16_table) {
    ctrl_model *held = load(1, 0, 0, 0, NULL), *rounded = load(0, 1, 0, 0, NULL);
    char pa[] = "/tmp/ctrl_emb16_push_a_XXXXXX", pb[] = "/tmp/ctrl_emb16_push_b_XXXXXX";
    const int fa = mkstemp(pa), fb = mkstemp(pb); /* the writer replaces the files; only the names are used */
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    CHECK(held && rounded && fa >= 0 && fb >= 0 && ctrl_model_embedding_held_bf16(held));
    if (held && rounded && !ctrl_model_base_in_panels(held)) {
        CHECK_EQ_INT(ctrl_peft_save_merged_weights(held, pa, CTRL_F32), CTRL_OK);
        CHECK_EQ_INT(ctrl_peft_save_merged_weights(rounded, pb, CTRL_F32), CTRL_OK);
        ctrl_safetensors *a = NULL, *b = NULL;
        CHECK_EQ_INT(ctrl_safetensors_open(pa, &a), CTRL_OK);
        CHECK_EQ_INT(ctrl_safetensors_open(pb, &b), CTRL_OK);
        const ctrl_st_tensor *e = a ? ctrl_safetensors_find(a, "model.embed_tokens.weight") : NULL;
        CHECK(e && e->dtype == CTRL_BF16);
        const int n = b ? ctrl_safetensors_count(b) : 0;
        CHECK(n > 0 && a && ctrl_safetensors_count(a) == n);
        for (int i = 0; a && i < n; i++) {
            const ctrl_st_tensor *t = ctrl_safetensors_at(b, i);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            float *x = malloc(sizeof(float) * (size_t)numel), *y = malloc(sizeof(float) * (size_t)numel);
            CHECK_EQ_INT(ctrl_safetensors_read_f32(a, t->name, x, numel), CTRL_OK);
            CHECK_EQ_INT(ctrl_safetensors_read_f32(b, t->name, y, numel), CTRL_OK);
            CHECK_MSG(!memcmp(x, y, sizeof(float) * (size_t)numel), "%s differs", t->name);
            free(x), free(y);
        }
        ctrl_safetensors_close(a), ctrl_safetensors_close(b);
    }
    unlink(pa), unlink(pb);
    ctrl_model_free(held), ctrl_model_free(rounded);
}
