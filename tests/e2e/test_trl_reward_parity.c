/* ctrl's reward-model curves against TRL's RewardTrainer (fixtures from
 * tests/reference/make_trl_reward_curves.py): the tiny Qwen2ForSequenceClassification of
 * tests/fixtures/score/qwen2 with the tiny_bpe tokenizer, arithmetic pairs with a margin column,
 * 20 optimizer steps through `ctrl_train_run` (the preference loader, the sequence kind's score
 * path, the reward plugin, the loop, AdamW). Per step: loss and grad_norm within 1e-4 relative,
 * the learning rate, num_tokens, and TRL's min_reward, mean_reward, max_reward, accuracy and margin
 * within 1e-4 (relative, floored at 0.1). Cases: center_rewards_coefficient with batches of 4, and
 * gradient accumulation (2 x 2); lora_margin: the first under a PEFT LoRA adapter of task_type SEQ_CLS
 * (tests/reference/make_lora_reward_curve.py: all-linear, r 8, the score trained in full as a
 * modules_to_save), started from PEFT's initial adapter; the adapter ctrl saves has PEFT's
 * adapter_config.json (task_type SEQ_CLS, modules_to_save classifier + score) and exactly the tensors
 * of the adapter PEFT saved after TRL's 20 steps, under the same names, equal within 1e-4. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"
#include "train/train.h"

#define DIR CTRL_FIXTURE_DIR "/trl_reward"

/* Where the runs write: CTRL_LORA_EXPORT_DIR when set (to keep ctrl's adapter for
 * tests/reference/check_peft_reward_adapter.py), else the test's temporary directory. */
static const char *out_root(void) {
    const char *e = getenv("CTRL_LORA_EXPORT_DIR");
    return e && e[0] ? e : test_tmp_dir();
}

static const char *const keys[] = {"min_reward", "mean_reward", "max_reward", "accuracy", "margin"};

static double value(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return v ? v->valuedouble : NAN;
}

static void run_case(const char *name) {
    if (!test_tmp_dir()) TEST_SKIP("no temporary directory");
    char src[1024], ini[1200], out[1200], path[1300];
    snprintf(src, sizeof src, DIR "/%s.ini", name);
    snprintf(out, sizeof out, "%s/reward_%s", out_root(), name);
    snprintf(ini, sizeof ini, "%s/reward_%s.ini", test_tmp_dir(), name);
    const char *const subs[][2] = {{"@DIR@", DIR}, {"@MODEL@", test_reward_model_dir()}, {"@OUT@", out}};
    CHECK(test_write_ini_template(src, ini, subs, 3) == 0);
    mkdir(out, 0755);
    ctrl_status st = test_train_ini(ini, NULL, 0);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    snprintf(path, sizeof path, DIR "/%s.trl.jsonl", name);
    char *ours, *theirs;
    if (st != CTRL_OK || !test_read_curves(out, path, &ours, &theirs)) return;
    char *sa, *sb;
    int steps = 0;
    double worst = 0;
    for (char *la = ours ? strtok_r(ours, "\n", &sa) : NULL,
              *lb = theirs ? strtok_r(theirs, "\n", &sb) : NULL;
         la && lb; la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        cJSON *a = cJSON_Parse(la), *b = cJSON_Parse(lb);
        const int step = (int)value(b, "step");
        CHECK_EQ_INT((int)value(a, "step"), step);
        const double el = fabs(value(a, "loss") - value(b, "loss")) / fabs(value(b, "loss")),
                     eg = fabs(value(a, "grad_norm") - value(b, "grad_norm")) / fabs(value(b, "grad_norm"));
        CHECK_MSG(el <= 1e-4 && eg <= 1e-4, "%s step %d: loss %.7g (TRL %.7g), grad_norm %.7g (TRL %.7g)",
                  name, step, value(a, "loss"), value(b, "loss"), value(a, "grad_norm"),
                  value(b, "grad_norm"));
        CHECK_NEAR(value(a, "learning_rate"), value(b, "learning_rate"), 1e-9);
        CHECK_EQ_INT((long)value(a, "num_tokens"), (long)value(b, "num_tokens"));
        worst = fmax(worst, fmax(el, eg));
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            const double x = value(a, keys[i]), y = value(b, keys[i]), e = fabs(x - y) / (fabs(y) + 0.1);
            CHECK_MSG(e <= 1e-4, "%s step %d: %s = %.7g, TRL %.7g", name, step, keys[i], x, y);
            worst = fmax(worst, e);
        }
        steps++;
        cJSON_Delete(a), cJSON_Delete(b);
    }
    CHECK_EQ_INT(steps, 20);
    printf("  %s: 20 steps, worst relative error %.2g (loss, grad_norm, reward metrics)\n", name, worst);
    free(ours), free(theirs);
}

/* ctrl's saved adapter against the one PEFT saved after TRL's run: the same tensor names, shapes and
 * values (worst absolute difference printed). */
static void compare_adapters(const char *ours_dir, const char *theirs_dir) {
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/adapter_model.safetensors", ours_dir);
    snprintf(pb, sizeof pb, "%s/adapter_model.safetensors", theirs_dir);
    ctrl_safetensors *a = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(pa, &a), CTRL_OK);
    CHECK_EQ_INT(ctrl_safetensors_open(pb, &b), CTRL_OK);
    if (!a || !b) goto done;
    CHECK_EQ_INT(ctrl_safetensors_count(a), ctrl_safetensors_count(b));
    double worst = 0;
    int score = 0;
    for (int i = 0; i < ctrl_safetensors_count(b); i++) {
        const ctrl_st_tensor *tb = ctrl_safetensors_at(b, i), *ta = ctrl_safetensors_find(a, tb->name);
        CHECK_MSG(ta != NULL, "ctrl's adapter has no '%s'", tb->name);
        if (!ta) continue;
        score += !strcmp(tb->name, "base_model.model.score.weight");
        CHECK_EQ_INT(ta->ndim, tb->ndim);
        int64_t n = 1;
        for (int d = 0; d < tb->ndim; d++) {
            CHECK_EQ_INT((long)ta->shape[d], (long)tb->shape[d]);
            n *= tb->shape[d];
        }
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        CHECK_EQ_INT(ctrl_safetensors_read_f32(a, tb->name, x, n), CTRL_OK);
        CHECK_EQ_INT(ctrl_safetensors_read_f32(b, tb->name, y, n), CTRL_OK);
        double w = 0;
        for (int64_t k = 0; k < n; k++) w = fmax(w, fabs((double)x[k] - y[k]));
        CHECK_MSG(w <= 1e-4, "%s: differs from PEFT's by %.3g", tb->name, w);
        worst = fmax(worst, w);
        free(x), free(y);
    }
    CHECK_EQ_INT(score, 1);
    printf("  adapter: %d tensors as PEFT names them, worst absolute difference %.2g\n",
           ctrl_safetensors_count(b), worst);
    char cfg[1300];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", ours_dir);
    ctrl_status rst;
    char *text = ctrl_read_text_file(cfg, 1 << 20, &rst);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    const cJSON *task = cJSON_GetObjectItem(o, "task_type"), *mts = cJSON_GetObjectItem(o, "modules_to_save");
    CHECK(cJSON_IsString(task) && !strcmp(task->valuestring, "SEQ_CLS"));
    CHECK(cJSON_IsArray(mts) && cJSON_GetArraySize(mts) == 2 &&
          !strcmp(cJSON_GetArrayItem(mts, 1)->valuestring, "score"));
    cJSON_Delete(o);
    free(text);
done:
    ctrl_safetensors_close(a);
    ctrl_safetensors_close(b);
}

TEST(margin_center) { run_case("margin_center"); }
TEST(lora_margin) {
    run_case("lora_margin");
    char out[1200];
    snprintf(out, sizeof out, "%s/reward_lora_margin", out_root());
    compare_adapters(out, DIR "/lora_final");
}
TEST(grad_accum) { run_case("grad_accum"); }
