/* trainable_token_indices beside LoRA (core/model/lora_tokens.c) past what test_lora.c's PEFT parity
 * covers (log-probs and every gradient through the head's backward after a forward):
 *   - the one-pass head (SFT's fused forward + backward) gives PEFT's gradient of the rows too;
 *   - a central finite difference of the loss in the rows' values, for a row the batch looks up and
 *     for one only the tied head reads;
 *   - the adapters off give the base model's log-probs bit for bit (the base's rows written back) and
 *     on again the adapter's, bit for bit;
 *   - rows changed after a forward (an optimizer step) are the ones the next forward reads, and merging
 *     writes them into the table: the merged model computes what the adapter does;
 *   - the adapter ctrl saves is PEFT's (the list in adapter_config.json, the tensor under PEFT's name)
 *     and loads back to the same log-probs;
 *   - what is not implemented or not valid is refused by name: a multi-adapter bank, a token outside the
 *     vocabulary, a token twice, a module other than the input embedding in the dictionary form. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ctrl/attention.h>

#include "fixture_batch.h"
#include "backend_case.h"
#include "json_file.h"
#include "model/model_internal.h"
#include "model/peft.h"
#include "model/safetensors.h"
#include "registry/registry.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_eager(void);

static const ctrl_attention_ops *eager(void) {
    const ctrl_plugin *p = ctrl_plugins_eager()[0];
    if (p->init) p->init(ctrl_host_table());
    return p->ops;
}

static const char qwen2[] = CTRL_FIXTURE_DIR "/models/qwen2";
static const char tied_case[] = CTRL_FIXTURE_DIR "/lora/qwen2_trainable_tokens"; /* tokens 57, 5, 100, 116 */

typedef struct batch {
    fixture_batch f;
    int T;
    ctrl_batch b;
    float *logp, *dlogp;
} batch;

static void tokens_batch(batch *x) {
    batch_load(&x->f, "qwen2");
    x->T = x->f.T, x->b = x->f.b;
    x->logp = calloc((size_t)x->T, sizeof(float)), x->dlogp = calloc((size_t)x->T, sizeof(float));
    int targets = 0;
    for (int t = 0; t < x->T; t++) targets += x->f.tg[t] >= 0;
    for (int t = 0; t < x->T; t++) x->dlogp[t] = x->f.tg[t] >= 0 ? -1.0f / targets : 0.0f; /* the mean NLL */
}

static void tokens_batch_free(batch *x) { batch_free(&x->f), free(x->logp), free(x->dlogp); }

static double loss_of(ctrl_model *m, batch *f) {
    CHECK_EQ_INT(ctrl_model_forward(m, &f->b, f->logp, NULL, NULL), CTRL_OK);
    double l = 0;
    for (int t = 0; t < f->T; t++) l += (double)f->dlogp[t] * f->logp[t];
    return l;
}

static ctrl_model *load(const char *adapter) {
    ctrl_model *m = NULL;
    const ctrl_status st = ctrl_peft_load(qwen2, adapter, eager(), &m);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    return m;
}

static const ctrl_param_view *rows_view(const ctrl_model *m) {
    return ctrl_model_find_view(m, "model.embed_tokens.token_adapter.trainable_tokens_delta");
}

TEST(the_one_pass_head_gives_peft_gradient_of_the_rows) {
    ctrl_model *m = load(tied_case);
    batch f;
    tokens_batch(&f);
    const ctrl_param_view *v = m ? rows_view(m) : NULL;
    CHECK(v != NULL && v->numel == 4 * 64);
    if (!v) return;
    float *want = malloc(sizeof(float) * (size_t)v->numel);
    ctrl_safetensors *gs = NULL;
    CHECK_EQ_INT(
        ctrl_safetensors_open(CTRL_FIXTURE_DIR "/lora/qwen2_trainable_tokens/grads.safetensors", &gs),
        CTRL_OK);
    CHECK_EQ_INT(
        ctrl_safetensors_read_f32(
            gs, "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", want, v->numel),
        CTRL_OK);
    ctrl_safetensors_close(gs);
    CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_forward_fused(m, &f.b, f.dlogp, f.logp, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, NULL), CTRL_OK);
    const float *g = ctrl_model_grads(m, NULL) + (v->offset - ctrl_model_trainable_offset(m));
    const double e = test_rel_error_f32(g, want, v->numel);
    CHECK_MSG(e <= 2e-5, "the rows' gradient through the one-pass head: relative error %.3g", e);
    /* row 2 (token 100) is not in the batch: its gradient is the tied head's alone, and not zero */
    double head_only = 0;
    for (int c = 0; c < 64; c++) head_only += fabs(g[2 * 64 + c]);
    CHECK(head_only > 0);
    printf("  one-pass head: the rows' gradient %.1e from PEFT's (token 100's, the head's alone: |g| %.2e)\n",
           e, head_only);
    free(want);
    tokens_batch_free(&f);
    ctrl_model_free(m);
}

TEST(finite_differences_of_the_rows) {
    ctrl_model *m = load(tied_case);
    batch f;
    tokens_batch(&f);
    const ctrl_param_view *v = m ? rows_view(m) : NULL;
    if (!v) return;
    CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
    loss_of(m, &f);
    CHECK_EQ_INT(ctrl_model_backward(m, f.dlogp), CTRL_OK);
    const float *g = ctrl_model_grads(m, NULL) + (v->offset - ctrl_model_trainable_offset(m));
    float *p = ctrl_model_params(m, NULL) + v->offset;
    static const int at[] = {0 * 64 + 3, 0 * 64 + 40, 2 * 64 + 7,
                             3 * 64 + 63}; /* token 57 (x2), 100 (head only), 116 */
    for (int i = 0; i < 4; i++) {
        const float keep = p[at[i]], h = 1e-2f;
        p[at[i]] = keep + h;
        ctrl_model_weights_changed(m);
        const double up = loss_of(m, &f);
        p[at[i]] = keep - h;
        ctrl_model_weights_changed(m);
        const double down = loss_of(m, &f);
        p[at[i]] = keep;
        ctrl_model_weights_changed(m);
        const double fd = (up - down) / (2.0 * h);
        CHECK_MSG(fabs(fd - g[at[i]]) <= 2e-3 * fabs(g[at[i]]) + 2e-6,
                  "row value %d: finite difference %.6g, gradient %.6g", at[i], fd, (double)g[at[i]]);
        printf("  row value %3d: finite difference %+.6e, gradient %+.6e\n", at[i], fd, (double)g[at[i]]);
    }
    tokens_batch_free(&f);
    ctrl_model_free(m);
}

TEST(adapters_off_give_the_base_rows_and_on_again_the_trained_ones) {
    ctrl_model *m = load(tied_case), *base = NULL;
    CHECK_EQ_INT(ctrl_model_load(qwen2, eager(), &base), CTRL_OK);
    batch f;
    tokens_batch(&f);
    float *on = malloc(sizeof(float) * (size_t)f.T), *off = malloc(sizeof(float) * (size_t)f.T),
          *want = malloc(sizeof(float) * (size_t)f.T);
    if (m && base) {
        loss_of(m, &f), memcpy(on, f.logp, sizeof(float) * (size_t)f.T);
        ctrl_model_set_adapters_enabled(m, 0);
        loss_of(m, &f), memcpy(off, f.logp, sizeof(float) * (size_t)f.T);
        loss_of(base, &f), memcpy(want, f.logp, sizeof(float) * (size_t)f.T);
        CHECK_MSG(!memcmp(off, want, sizeof(float) * (size_t)f.T), "adapters off: not the base's log-probs");
        ctrl_model_set_adapters_enabled(m, 1);
        loss_of(m, &f);
        CHECK_MSG(!memcmp(on, f.logp, sizeof(float) * (size_t)f.T), "adapters on again: not the adapter's");
        CHECK(memcmp(on, off, sizeof(float) * (size_t)f.T) != 0);
    }
    free(on), free(off), free(want);
    tokens_batch_free(&f);
    ctrl_model_free(m), ctrl_model_free(base);
}

TEST(changed_rows_are_read_and_merged) {
    ctrl_model *m = load(tied_case);
    batch f;
    tokens_batch(&f);
    const ctrl_param_view *v = m ? rows_view(m) : NULL;
    if (!v) return;
    const double before = loss_of(m, &f);
    float *p = ctrl_model_params(m, NULL) + v->offset;
    for (int64_t k = 0; k < v->numel; k++) p[k] *= 1.5f; /* as an optimizer step would change them */
    ctrl_model_weights_changed(m);
    const double after = loss_of(m, &f);
    CHECK_MSG(fabs(after - before) > 1e-3, "the changed rows were not read: loss %.6f, was %.6f", after,
              before);
    float *logp = malloc(sizeof(float) * (size_t)f.T);
    memcpy(logp, f.logp, sizeof(float) * (size_t)f.T);
    CHECK_EQ_INT(ctrl_peft_merge(m), CTRL_OK);
    const float *table =
        ctrl_model_params(m, NULL) + ctrl_model_find_view(m, "model.embed_tokens.weight")->offset;
    CHECK(!memcmp(table + 116 * 64, p + 3 * 64, sizeof(float) * 64)); /* token 116's row is row 3's values */
    const double merged = loss_of(m, &f);
    const double e = test_rel_error_f32(f.logp, logp, f.T);
    CHECK_MSG(e <= 1e-5, "merged: log-probs relative error %.3g (loss %.6f vs %.6f)", e, merged, after);
    printf("  rows x 1.5: loss %.6f -> %.6f; merged %.6f (log-probs %.1e)\n", before, after, merged, e);
    free(logp);
    tokens_batch_free(&f);
    ctrl_model_free(m);
}

TEST(a_saved_adapter_is_pefts_and_loads_back) {
    ctrl_model *m = load(CTRL_FIXTURE_DIR "/lora/llama_trainable_tokens_dict"); /* the dictionary form */
    ctrl_model_free(m);
    m = load(tied_case);
    char dir[] = "/tmp/ctrl_lora_tokens_XXXXXX", path[1100];
    CHECK(mkdtemp(dir) != NULL);
    batch f;
    tokens_batch(&f);
    if (m) {
        loss_of(m, &f);
        float *want = malloc(sizeof(float) * (size_t)f.T);
        memcpy(want, f.logp, sizeof(float) * (size_t)f.T);
        CHECK_EQ_INT(ctrl_peft_save(m, dir, qwen2), CTRL_OK);
        static ctrl_lora_config lc;
        CHECK_EQ_INT(ctrl_peft_read_config(dir, &lc, NULL, 0), CTRL_OK);
        CHECK_EQ_INT(lc.n_tokens, 4);
        CHECK(lc.tokens[0] == 57 && lc.tokens[1] == 5 && lc.tokens[2] == 100 && lc.tokens[3] == 116);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        ctrl_safetensors *s = NULL;
        CHECK_EQ_INT(ctrl_safetensors_open(path, &s), CTRL_OK);
        CHECK(s && ctrl_safetensors_find(
                       s, "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"));
        ctrl_safetensors_close(s);
        ctrl_model *back = load(dir);
        if (back) loss_of(back, &f);
        CHECK(back && !memcmp(want, f.logp, sizeof(float) * (size_t)f.T));
        ctrl_model_free(back);
        free(want);
        unlink(path);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        unlink(path);
    }
    rmdir(dir);
    tokens_batch_free(&f);
    ctrl_model_free(m);
}

/* modules_to_save with the adapters off: the base's tables (PEFT's disable_adapter()), on the CPU: an
 * untied head, an embedding, a tied table (ensure_weight_tying). */
TEST(adapters_off_give_the_base_of_modules_to_save) {
    backend_saved_off_check(NULL, (ctrl_device){CTRL_DEVICE_CPU, 0}, "llama_all_rslora", "llama",
                            "lm_head.weight");
    backend_saved_off_check(NULL, (ctrl_device){CTRL_DEVICE_CPU, 0}, "qwen3_default_init", "qwen3",
                            "model.embed_tokens.weight");
    backend_saved_off_check(NULL, (ctrl_device){CTRL_DEVICE_CPU, 0}, "qwen2_tied_saved_ewt", "qwen2",
                            "model.embed_tokens.weight");
}

static ctrl_status config_with(const char *dir, const char *tokens_json, ctrl_lora_config *lc) {
    char path[1100];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *fp = fopen(path, "w");
    fprintf(fp,
            "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"q_proj\"], "
            "\"trainable_token_indices\": %s}",
            tokens_json);
    fclose(fp);
    const ctrl_status st = ctrl_peft_read_config(dir, lc, NULL, 0);
    unlink(path);
    return st;
}

TEST(what_is_not_implemented_or_not_valid_is_refused_by_name) {
    static ctrl_lora_config lc;
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(qwen2, eager(), &m), CTRL_OK);
    int id = -1;
    CHECK_EQ_INT(ctrl_model_add_adapter(m, tied_case, &id), CTRL_ERR_UNSUPPORTED); /* a bank's */
    CHECK_CONTAINS(ctrl_error_message(), "trainable_token_indices");
    ctrl_model_free(m), m = NULL;
    memset(&lc, 0, sizeof lc), lc.r = 2, lc.lora_alpha = 4;
    CHECK_EQ_INT(ctrl_lora_add_target(&lc, "q_proj", "test"), CTRL_OK);
    CHECK_EQ_INT(ctrl_lora_add_token(&lc, 5, "test"), CTRL_OK);
    CHECK_EQ_INT(ctrl_lora_add_token(&lc, 5, "test"), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "twice");
    CHECK_EQ_INT(ctrl_lora_add_token(&lc, -1, "test"), CTRL_ERR_CONFIG);
    CHECK_EQ_INT(ctrl_lora_add_token(&lc, 128, "test"), CTRL_OK); /* the vocabulary is 128: 0 .. 127 */
    CHECK_EQ_INT(ctrl_model_load_lora(qwen2, eager(), &lc, &m), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "token 128 is outside");
    lc.n_tokens = 1, lc.save_embed_tokens = 1;
    CHECK(ctrl_model_load_lora(CTRL_FIXTURE_DIR "/models/llama", eager(), &lc, &m) == CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "modules_to_save embed_tokens");
    CHECK(m == NULL);
    /* modules_to_save on a tied table: refused unless ensure_weight_tying (then one trained table) */
    lc.n_tokens = 0, lc.save_embed_tokens = 0, lc.save_lm_head = 1;
    CHECK_EQ_INT(ctrl_model_load_lora(qwen2, eager(), &lc, &m), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "ensure_weight_tying");
    lc.ensure_weight_tying = 1;
    CHECK_EQ_INT(ctrl_model_load_lora(qwen2, eager(), &lc, &m), CTRL_OK);
    const ctrl_param_view *table = m ? ctrl_model_find_view(m, "model.embed_tokens.weight") : NULL;
    CHECK(table && table->offset >= ctrl_model_trainable_offset(m) &&
          !ctrl_model_find_view(m, "lm_head.weight"));
    ctrl_model_free(m), m = NULL;
    lc.ensure_weight_tying = 0, lc.save_lm_head = 0;
    char dir[] = "/tmp/ctrl_lora_tokens_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_EQ_INT(config_with(dir, "{\"wte\": [3]}", &lc), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "wte");
    CHECK_EQ_INT(config_with(dir, "{\"embed_tokens\": [3], \"model.lm_head\": [4, 3]}", &lc), CTRL_OK);
    CHECK(lc.n_tokens == 1 && lc.n_head_tokens == 2 && lc.head_tokens[0] == 4);
    /* a tied head is the embedding: another list for it is refused, the same one is the tied rows once */
    lc.n_head_tokens = 0;
    CHECK_EQ_INT(ctrl_lora_add_head_token(&lc, 9, "test"), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_load_lora(qwen2, eager(), &lc, &m), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "tie_word_embeddings");
    lc.head_tokens[0] = 3;
    CHECK_EQ_INT(ctrl_model_load_lora(qwen2, eager(), &lc, &m), CTRL_OK);
    CHECK(m && rows_view(m) && !ctrl_model_find_view(m, "lm_head.token_adapter.trainable_tokens_delta"));
    ctrl_model_free(m), m = NULL;
    CHECK_EQ_INT(config_with(dir, "[3, 3.5]", &lc), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "trainable_token_indices");
    CHECK_EQ_INT(config_with(dir, "{\"model.embed_tokens\": [3, 9]}", &lc), CTRL_OK);
    CHECK(lc.n_tokens == 2 && lc.tokens[1] == 9);
    CHECK_EQ_INT(config_with(dir, "\"3\"", &lc), CTRL_ERR_FORMAT);
    rmdir(dir);
}
