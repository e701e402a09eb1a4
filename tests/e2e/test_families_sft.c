/* SFT trains the new families as TRL does (fixtures from tests/reference/make_family_fixtures.py,
 * make_sft_curve): a tiny random Gemma 2 (GQA, head_dim != hidden/heads, window 8 on alternating
 * layers, final-logit soft-capping 3, tied embeddings) and a tiny Qwen3-MoE (8 experts, top 2
 * renormalised; without and with the load-balancing loss), each trained 20 optimizer steps on the arithmetic
 * rows of tests/fixtures/trl_sft in padded batches of 4 by TRL's SFTTrainer and by ctrl from the same
 * weights and hyper-parameters: per step, loss, grad_norm and entropy within 1e-4 relative for steps
 * 1-5 and 1e-3 through step 20 (and TRL's aux_loss metric where it logs one), the learning rate, token
 * accuracy and token count as TRL logs them. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "test_registry.h"

static double num(const cJSON *o, const char *key) { return cJSON_GetObjectItem(o, key)->valuedouble; }

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

static void check_curve(const char *name) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1024], out[1024], dir[512], src[600], trl[600];
    snprintf(dir, sizeof dir, CTRL_FIXTURE_DIR "/families/%s", name);
    snprintf(src, sizeof src, "%s/padded.ini", dir), snprintf(trl, sizeof trl, "%s/padded.trl.jsonl", dir);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    snprintf(ini, sizeof ini, "%s/%s.ini", tmp, name);
    const char *const subs[][2] = {{"@DIR@", dir}, {"@OUT@", out}, {"@TRL@", CTRL_FIXTURE_DIR "/trl_sft"}};
    CHECK(test_write_ini_template(src, ini, subs, 3) == 0);
    mkdir(out, 0755);
    const ctrl_status st = test_train_ini(ini, NULL, 0);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    char *ours, *theirs;
    if (st != CTRL_OK || !test_read_curves(out, trl, &ours, &theirs)) return;
    char *sa, *sb;
    int steps = 0;
    double worst = 0;
    for (char *la = strtok_r(ours, "\n", &sa), *lb = strtok_r(theirs, "\n", &sb); la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        cJSON *a = cJSON_Parse(la), *b = cJSON_Parse(lb);
        if (cJSON_GetObjectItem(a, "step")) {
            const int step = (int)num(b, "step");
            const double tol = step <= 5 ? 1e-4 : 1e-3;
            CHECK_EQ_INT((int)num(a, "step"), step);
            static const char *const keys[] = {"loss", "grad_norm", "entropy"};
            for (int k = 0; k < 3; k++) {
                const double e = rel(num(a, keys[k]), num(b, keys[k]));
                worst = fmax(worst, e);
                CHECK_MSG(e <= tol, "step %d: %s %.7g vs TRL %.7g", step, keys[k], num(a, keys[k]),
                          num(b, keys[k]));
            }
            if (cJSON_GetObjectItem(b, "aux_loss")) /* TRL's aux_loss metric: the micro-batches' mean */
                CHECK_MSG(cJSON_GetObjectItem(a, "aux_loss") &&
                              rel(num(a, "aux_loss"), num(b, "aux_loss")) <= tol,
                          "step %d: aux_loss %.7g vs TRL %.7g", step,
                          cJSON_GetObjectItem(a, "aux_loss") ? num(a, "aux_loss") : NAN, num(b, "aux_loss"));
            CHECK_NEAR(num(a, "learning_rate"), num(b, "learning_rate"), 1e-9);
            CHECK_NEAR(num(a, "mean_token_accuracy"), num(b, "mean_token_accuracy"), 1e-6);
            CHECK_EQ_INT((long)num(a, "num_tokens"), (long)num(b, "num_tokens"));
            steps++;
        }
        cJSON_Delete(a), cJSON_Delete(b);
    }
    CHECK_EQ_INT(steps, 20);
    printf("  %s: 20 steps, worst relative error (loss, grad_norm, entropy) %.2g\n", name, worst);
    free(ours), free(theirs);
}

TEST(gemma2_sft_curve_matches_trl) { check_curve("gemma2_sft"); }
TEST(qwen3_moe_sft_curve_matches_trl) { check_curve("qwen3_moe_sft"); }
/* with router_aux_loss_coef = 0.01: TRL adds coef x the load-balancing loss / accumulation steps to each
 * micro-batch's loss, and its gradient through the routers */
TEST(qwen3_moe_sft_with_aux_loss_matches_trl) { check_curve("qwen3_moe_sft_aux"); }
