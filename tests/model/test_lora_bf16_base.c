/* The frozen base of a LoRA model computing in bf16 held in bf16 (ctrl_model_hold_base_bf16,
 * model_bf16_store.c): bf16 compute multiplies the base's projection weights as bf16 values
 * anyway, so the log-probabilities and every adapter / modules_to_save gradient are bit for bit
 * those of the same model keeping its base in fp32 -- two steps, dropout on, the adapters changed
 * between them (each layer widened again from its 2-byte store, forward then backward in reverse
 * order), over Qwen2 (q/k/v biases: the layers' norms and biases stay exact) and Llama with
 * rsLoRA. The parameters then occupy 2 bytes per base projection weight plus one layer widened in
 * fp32 (ctrl_model_param_bytes) -- or, where a bf16 GEMM kernel runs, the GEMM's panels of each
 * projection (packed once, never widened: the forward, dX and decoding multiply by them). Refused, the model
 * unchanged, where it would change the numbers: fp32 compute, DoRA (its norms read the fp32 base). Run on the
 * AVX-512 BF16 path and the portable one (CTRL_NO_AVX512BF16: the adapters rounded per call, the held base
 * taken as already rounded). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ctrl/attention.h>
#include <ctrl/memory.h>

#include "cpu/cpu_ops.h"
#include "json_file.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/peft.h"
#include "registry/registry.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_eager(void);

static const ctrl_attention_ops *eager(void) {
    const ctrl_plugin *p = ctrl_plugins_eager()[0];
    if (p->init) p->init(ctrl_host_table());
    return p->ops;
}

/* at_load: the base held in bf16 as it loads (ctrl_lora_config.bf16_base) */
static ctrl_model *load(const char *name, int at_load) {
    char adapter[1024], base[512], dir[1600];
    snprintf(adapter, sizeof adapter, "%s/lora/%s", CTRL_FIXTURE_DIR, name);
    ctrl_lora_config lc;
    ctrl_model *m = NULL;
    ctrl_status st = ctrl_peft_read_config(adapter, &lc, base, sizeof base);
    if (st == CTRL_OK) snprintf(dir, sizeof dir, "%s/%s", CTRL_FIXTURE_DIR, base);
    lc.bf16_base = at_load;
    if (st == CTRL_OK) st = ctrl_model_load_lora(dir, eager(), &lc, &m);
    if (st == CTRL_OK) st = ctrl_peft_load_weights(m, adapter);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    return st == CTRL_OK ? m : (ctrl_model_free(m), NULL);
}

static void same_steps(const char *name, const char *arch) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s/batch.json", CTRL_FIXTURE_DIR, arch);
    cJSON *root = json_file(path);
    int T = 0, n, n_cu = 0;
    int32_t *tok = json_ints(root, "tokens", &T), *pos = json_ints(root, "positions", &n),
            *tg = json_ints(root, "targets", &n), *cu = json_ints(root, "cu_seqlens", &n_cu);
    cJSON_Delete(root);
    const ctrl_batch b = {
        .T = T, .B = n_cu - 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    /* fp32 base; held after loading; held as it loads */
    ctrl_model *m[3] = {load(name, 0), load(name, 0), load(name, 1)};
    float *lp[3] = {calloc((size_t)T, 4), calloc((size_t)T, 4), calloc((size_t)T, 4)},
          *dlogp = calloc((size_t)T, 4);
    for (int t = 0; t < T; t++) dlogp[t] = tg[t] >= 0 ? -0.05f : 0.0f;
    size_t in2d = 0, in1d = 0, layer0 = 0, np = 0, panels = 0;
    for (int v = 0; m[2] && v < ctrl_model_view_count(m[2]); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m[2], v);
        if (strncmp(pv->name, "model.layers.", 13) != 0 || pv->offset >= ctrl_model_trainable_offset(m[2]))
            continue;
        *(pv->ndim == 1 ? &in1d : &in2d) += (size_t)pv->numel;
        if (pv->ndim == 2) panels += ctrl_cpu_gemm_bf16_pack_bytes((int)pv->shape[0], (int)pv->shape[1]);
        if (!strncmp(pv->name, "model.layers.0.", 15)) layer0 += (size_t)pv->numel;
    }
    /* where a bf16 GEMM kernel runs the base is held as its panels (one weight per projection here),
     * else as 2-byte values widened a layer at a time */
    const int in_panels = ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32;
    if (m[2]) { /* as loaded: 2 bytes per base layer weight, the layers' norms and biases also in fp32 */
        ctrl_model_params(m[2], &np);
        CHECK(ctrl_model_base_held_bf16(m[2]) && !ctrl_model_base_held_bf16(m[0]));
        CHECK_EQ_INT(ctrl_model_base_in_panels(m[2]), in_panels);
        const size_t want =
            in_panels ? 4 * (np - in2d) + panels : 4 * (np - in2d - in1d) + 2 * (in2d + in1d) + 4 * in1d;
        CHECK_MSG(ctrl_model_param_bytes(m[2]) == want, "%s: as loaded, parameters in %zu bytes, want %zu",
                  name, ctrl_model_param_bytes(m[2]), want);
    }
    if (m[0] && m[1] && m[2]) {
        for (int k = 0; k < 3; k++) CHECK_EQ_INT(ctrl_model_set_compute_dtype(m[k], CTRL_BF16), CTRL_OK);
        const size_t fp32_bytes = ctrl_model_param_bytes(m[1]);
        CHECK_MSG(ctrl_model_hold_base_bf16(m[1]) == CTRL_OK, "%s: %s", name, ctrl_error_message());
        CHECK_EQ_INT(ctrl_model_hold_base_bf16(m[1]), CTRL_ERR_RUNTIME); /* once */
        for (int step = 0; step < 2; step++) {
            size_t ng = 0;
            float *g[3] = {NULL, NULL, NULL};
            for (int k = 0; k < 3; k++) {
                ctrl_model_set_training(m[k], 1, (uint64_t)step + 3);
                CHECK_EQ_INT(ctrl_model_zero_grad(m[k]), CTRL_OK);
                CHECK_EQ_INT(ctrl_model_forward_fused(m[k], &b, dlogp, lp[k], NULL, NULL), CTRL_OK);
                CHECK_EQ_INT(ctrl_model_backward(m[k], NULL), CTRL_OK);
                g[k] = (float *)ctrl_model_grads(m[k], &ng);
            }
            for (int k = 1; k < 3; k++)
                CHECK_MSG(!memcmp(lp[0], lp[k], sizeof(float) * (size_t)T),
                          "%s step %d: log-probs differ (%d)", name, step, k);
            for (int k = 1; k < 3; k++)
                CHECK_MSG(ng > 0 && !memcmp(g[0], g[k], sizeof(float) * ng),
                          "%s step %d: gradients differ (%d: rel %.3g)", name, step, k,
                          test_rel_error_f32(g[k], g[0], (long)ng));
            for (int k = 0; k < 3; k++) { /* an optimizer's step on the trainable tensors, the same on both */
                size_t n = 0;
                float *p = ctrl_model_params(m[k], &n);
                const size_t off = ctrl_model_trainable_offset(m[k]);
                for (size_t i = off; i < n; i++) p[i] -= 0.5f * g[k][i - off];
                ctrl_model_weights_changed(m[k]);
            }
        }
        /* and after the steps layer 0 (the backward's last) widened in fp32 too; panels: as loaded */
        const size_t want = in_panels ? 4 * (np - in2d) + panels
                                      : 4 * (np - in2d - in1d) + 2 * (in2d + in1d) + 4 * in1d + 4 * layer0;
        for (int k = 1; k < 3; k++)
            CHECK_MSG(ctrl_model_param_bytes(m[k]) == want, "%s: parameters in %zu bytes, want %zu (%d)",
                      name, ctrl_model_param_bytes(m[k]), want, k);
        CHECK(ctrl_model_param_bytes(m[0]) == 4 * np && fp32_bytes == 4 * np); /* (two layers: one widened
                                                                                * in fp32 eats the saving) */
        printf("  %-18s 2 steps bit for bit; parameters %zu bytes held, %zu in fp32\n", name,
               ctrl_model_param_bytes(m[1]), fp32_bytes);
    }
    ctrl_model_free(m[0]), ctrl_model_free(m[1]), ctrl_model_free(m[2]);
    free(lp[0]), free(lp[1]), free(lp[2]), free(dlogp), free(tok), free(pos), free(tg), free(cu);
}

TEST(lora_base_held_in_bf16_changes_no_number) {
    same_steps("qwen2_attn_mlp", "qwen2");
    same_steps("llama_all_rslora", "llama");
}

TEST(lora_base_held_in_bf16_only_where_the_numbers_stay) {
    ctrl_model *m = load("llama_qv", 0);
    if (m) { /* fp32 compute multiplies the fp32 base */
        CHECK_EQ_INT(ctrl_model_hold_base_bf16(m), CTRL_ERR_UNSUPPORTED);
        size_t np = 0;
        ctrl_model_params(m, &np);
        CHECK(ctrl_model_param_bytes(m) == 4 * np);
    }
    ctrl_model_free(m);
    m = load("llama_dora_qv", 1); /* asked to hold it as it loads: stays fp32 */
    if (m) {
        CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_hold_base_bf16(m), CTRL_ERR_UNSUPPORTED);
        size_t np = 0;
        ctrl_model_params(m, &np);
        CHECK(ctrl_model_param_bytes(m) == 4 * np && !ctrl_model_base_held_bf16(m));
    }
    ctrl_model_free(m);
}

/* Two fresh models, the same batch, one forward + backward each: the same gradients bit for bit over
 * the whole buffer (a guard against reads of uninitialized scratch in the backward, which would show
 * as gradients differing between two such models). A longer random batch too, with uneven
 * sequences. */
static void repeatable(const char *name, int at_load, int T, int n_seqs) {
    int32_t *tok = calloc((size_t)T, 4), *pos = calloc((size_t)T, 4), *tg = calloc((size_t)T, 4),
            cu[4] = {0, T / 3, T - T / 4, T};
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < n_seqs; i++)
        for (int t = cu[i]; t < cu[i + 1]; t++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            tok[t] = (int32_t)(s % 128), pos[t] = t - cu[i];
            tg[t] = t + 1 < cu[i + 1] ? (int32_t)((s >> 20) % 128) : -100;
        }
    const ctrl_batch b = {
        .T = T, .B = n_seqs, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    /* the second model loaded after the first is freed, so that its buffers reuse the first's memory */
    ctrl_model *m[2] = {NULL, NULL};
    float *g[2] = {NULL, NULL}, *dlogp = calloc((size_t)T, 4), *lp = calloc((size_t)T, 4);
    for (int t = 0; t < T; t++) dlogp[t] = tg[t] >= 0 ? -0.05f : 0.0f;
    size_t ng[2] = {0, 0};
    for (int k = 0; k < 2 && (m[k] = load(name, at_load)); k++) {
        CHECK_EQ_INT(ctrl_model_set_compute_dtype(m[k], CTRL_BF16), CTRL_OK);
        ctrl_model_set_training(m[k], 1, 1);
        CHECK_EQ_INT(ctrl_model_zero_grad(m[k]), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_forward_fused(m[k], &b, dlogp, lp, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_backward(m[k], NULL), CTRL_OK);
        const float *gk = ctrl_model_grads(m[k], &ng[k]);
        g[k] = malloc(sizeof(float) * ng[k]);
        memcpy(g[k], gk, sizeof(float) * ng[k]);
        ctrl_model_free(m[k]);
    }
    if (g[0] && g[1])
        CHECK_MSG(ng[0] == ng[1] && !memcmp(g[0], g[1], sizeof(float) * ng[0]),
                  "%s (held at load %d, T %d): two fresh models' gradients differ (rel %.3g)", name, at_load,
                  T, test_rel_error_f32(g[0], g[1], (long)ng[0]));
    free(g[0]), free(g[1]), free(dlogp), free(lp), free(tok), free(pos), free(tg);
}

TEST(lora_gradients_repeat_bit_for_bit_in_fresh_models) {
    for (int at_load = 0; at_load < 2; at_load++) {
        repeatable("qwen2_attn_mlp", at_load, 24, 3);
        repeatable("qwen2_attn_mlp", at_load, 330, 3);
        repeatable("llama_all_rslora", at_load, 97, 3);
    }
}

static long minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/* A 4-layer all-linear LoRA model with ~4 MB layers, its base held in the 2-byte store (even where a
 * bf16 GEMM kernel would hold it as panels); refault: CTRL_TEST_BF16_REFAULT, the widened layer's
 * pages faulted fresh each time (the way before the pool). Two steps; the second's minor faults in
 * *faults, its log-probabilities and gradients copied into lp and *g. */
static void widened_steps(int refault, float *lp, float **g, size_t *ng, long *faults, size_t *layer_bytes) {
    ctrl_model_config cfg;
    CHECK_EQ_INT(ctrl_model_config_load(CTRL_FIXTURE_DIR "/models/qwen2", &cfg), CTRL_OK);
    cfg.hidden_size = 256, cfg.intermediate_size = 1024, cfg.n_layers = 4, cfg.n_heads = 4,
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    ctrl_lora_config lc = {.r = 4, .lora_alpha = 8, .all_linear = 1, .seed = 5};
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_create_lora(&cfg, eager(), &lc, &m), CTRL_OK);
    if (!m) return;
    ctrl_model_init_random(m, 11, 0.05f);
    setenv("CTRL_NO_BASE_PANELS", "1", 1);
    if (refault) setenv("CTRL_TEST_BF16_REFAULT", "1", 1);
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
    CHECK_MSG(ctrl_model_hold_base_bf16(m) == CTRL_OK, "%s", ctrl_error_message());
    unsetenv("CTRL_NO_BASE_PANELS"), unsetenv("CTRL_TEST_BF16_REFAULT");
    CHECK(ctrl_model_base_held_bf16(m) && !ctrl_model_base_in_panels(m));
    *layer_bytes = 0;
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        if (!strncmp(pv->name, "model.layers.0.", 15) && pv->offset < ctrl_model_trainable_offset(m))
            *layer_bytes += sizeof(float) * (size_t)pv->numel;
    }
    enum { T = 40 };
    int32_t tok[T], pos[T], tg[T], cu[3] = {0, 17, T};
    float dlogp[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 37 + 5) % 128, pos[t] = t < 17 ? t : t - 17, tg[t] = (t * 53 + 1) % 128,
        dlogp[t] = -0.05f;
    const ctrl_batch b = {.T = T, .B = 2, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    for (int step = 0; step < 2; step++) {
        const long before = minor_faults();
        ctrl_model_set_training(m, 1, (uint64_t)step + 1);
        CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_forward_fused(m, &b, dlogp, lp, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_backward(m, NULL), CTRL_OK);
        *faults = minor_faults() - before;
    }
    const float *gr = ctrl_model_grads(m, ng);
    *g = malloc(sizeof(float) * *ng);
    memcpy(*g, gr, sizeof(float) * *ng);
    ctrl_model_free(m);
}

/* The widened layer borrows a pool's resident pages (core/page_pool.h): a step after the first faults
 * none of the layers' pages in again -- against the old way, which faults each layer's pages at every
 * widening (the forward's and the backward's) -- and the numbers are the same bit for bit. */
TEST(lora_bf16_base_widens_into_resident_pages) {
    float lp[2][40];
    float *g[2] = {NULL, NULL};
    size_t ng[2] = {0, 0}, layer_bytes = 0;
    long faults[2] = {0, 0};
    for (int k = 0; k < 2; k++) widened_steps(k, lp[k], &g[k], &ng[k], &faults[k], &layer_bytes);
    const long layer_pages = (long)(layer_bytes / (size_t)sysconf(_SC_PAGESIZE));
    printf("  second step's minor faults: %ld reusing pages, %ld faulted fresh (a layer: %ld pages)\n",
           faults[0], faults[1], layer_pages);
    CHECK(!memcmp(lp[0], lp[1], sizeof lp[0]));
    CHECK(g[0] && g[1] && ng[0] == ng[1] && ng[0] > 0 && !memcmp(g[0], g[1], sizeof(float) * ng[0]));
    if (TEST_UNDER_ASAN) { /* its allocator maps each large scratch buffer afresh: faults of its own */
        printf("  under ASan: the fault counts are not checked\n");
        free(g[0]), free(g[1]);
        return;
    }
    /* the old way: 6 widenings' pages -- the forward's of layers 1-3 (layer 0 stays widened from the
     * first step's backward) and the backward's of layers 2-0 (layer 3 stays) */
    CHECK_MSG(faults[1] >= 6 * layer_pages * 9 / 10, "faulted fresh: %ld minor faults, want >= %ld",
              faults[1], 6 * layer_pages * 9 / 10);
    CHECK_MSG(faults[0] < layer_pages / 2, "reusing pages: %ld minor faults, want < %ld", faults[0],
              layer_pages / 2);
    free(g[0]), free(g[1]);
}
