/* ctrl's reward-model curves against TRL's RewardTrainer (fixtures from
 * tests/reference/make_trl_reward_curves.py): the tiny Qwen2ForSequenceClassification of
 * tests/fixtures/score/qwen2 with the tiny_bpe tokenizer, arithmetic pairs with a margin column,
 * 20 optimizer steps through `ctrl_train_run` (the preference loader, the sequence kind's score
 * path, the reward plugin, the loop, AdamW). Per step: loss and grad_norm within 1e-4 relative,
 * the learning rate, num_tokens, and TRL's min_reward, mean_reward, max_reward, accuracy and margin
 * within 1e-4 (relative, floored at 0.1). Cases: center_rewards_coefficient with batches of 4, and
 * gradient accumulation (2 x 2). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "test.h"
#include "test_registry.h"
#include "train/train.h"

#define DIR CTRL_FIXTURE_DIR "/trl_reward"

/* The classifier beside its tokenizer (ctrl reads the tokenizer from the model directory). */
static const char *model_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "%s/reward_model", test_tmp_dir());
    mkdir(dir, 0755);
    static const char *const files[][2] = {{"score/qwen2", "config.json"},
                                           {"score/qwen2", "model.safetensors"},
                                           {"tokenizer/tiny_bpe", "tokenizer.json"},
                                           {"tokenizer/tiny_bpe", "tokenizer_config.json"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[1200], to[1200];
        snprintf(from, sizeof from, "%s/%s/%s", CTRL_FIXTURE_DIR, files[i][0], files[i][1]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i][1]);
        CHECK_MSG(symlink(from, to) == 0, "symlink %s", to);
    }
    return dir;
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
    snprintf(out, sizeof out, "%s/reward_%s", test_tmp_dir(), name);
    snprintf(ini, sizeof ini, "%s/reward_%s.ini", test_tmp_dir(), name);
    const char *const subs[][2] = {{"@DIR@", DIR}, {"@MODEL@", model_dir()}, {"@OUT@", out}};
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

TEST(margin_center) { run_case("margin_center"); }
TEST(grad_accum) { run_case("grad_accum"); }
