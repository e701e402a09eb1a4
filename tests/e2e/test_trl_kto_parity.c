/* ctrl's KTO curves against TRL's KTOTrainer (fixtures from tests/reference/make_trl_kto_curves.py):
 * the tiny model of tests/fixtures/trl_sft, unpaired arithmetic rows (the right sum desirable, a
 * near miss undesirable), 20 optimizer steps through `ctrl_train_run` (the preference loader with
 * TRL's KL rotation, the sequence kind, the kto plugin, the loop). Every value TRL logs at each step
 * is compared: loss and grad_norm within 1e-4 relative, num_tokens exactly, the learning rate, and
 * kl, entropy, the rewards, logps and logits metrics within 1e-4 relative with a 0.1 floor (a reward
 * is a difference of two log-prob sums of ~-25, which fp32 leaves near zero). Cases: kto with a live
 * reference; kto with desirable/undesirable weights, beta 0.5, a precomputed reference and gradient
 * accumulation (2 x 2 rows); apo_zero_unpaired (no KL sequences). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_load.h"
#include "file_text.h"
#include "test.h"
#include "test_registry.h"
#include "train/train.h"

#define DIR CTRL_FIXTURE_DIR "/trl_kto"

static void run_case(const char *name) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char src[1024], ini[1200], out[1200], path[1300];
    snprintf(src, sizeof src, DIR "/%s.ini", name);
    snprintf(out, sizeof out, "%s/kto_%s", tmp, name);
    snprintf(ini, sizeof ini, "%s/kto_%s.ini", tmp, name);
    const char *const subs[][2] = {{"@DIR@", DIR}, {"@SFT@", CTRL_FIXTURE_DIR "/trl_sft"}, {"@OUT@", out}};
    CHECK(test_write_ini_template(src, ini, subs, 3) == 0);
    mkdir(out, 0755);
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(ini, NULL, 0, reg, &cfg);
    if (st == CTRL_OK) st = ctrl_train_run(cfg, NULL);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (st != CTRL_OK) return;
    snprintf(path, sizeof path, DIR "/%s.trl.jsonl", name);
    char *ours, *theirs;
    if (!test_read_curves(out, path, &ours, &theirs)) return;
    char *sa, *sb;
    int steps = 0, compared = 0;
    double worst_loss = 0, worst_metric = 0;
    for (char *la = strtok_r(ours, "\n", &sa), *lb = strtok_r(theirs, "\n", &sb); la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        cJSON *a = cJSON_Parse(la), *b = cJSON_Parse(lb);
        const int step = cJSON_GetObjectItem(b, "step")->valueint;
        CHECK_EQ_INT(cJSON_GetObjectItem(a, "step")->valueint, step);
        for (cJSON *it = b->child; it; it = it->next) { /* every value TRL logged at this step */
            if (!strcmp(it->string, "step")) continue;
            const cJSON *mine = cJSON_GetObjectItem(a, it->string);
            CHECK_MSG(mine != NULL, "%s step %d: no %s", name, step, it->string);
            if (!mine) continue;
            const double x = mine->valuedouble, y = it->valuedouble;
            if (!strcmp(it->string, "num_tokens")) {
                CHECK_EQ_INT((long)x, (long)y);
            } else if (!strcmp(it->string, "learning_rate")) {
                CHECK_NEAR(x, y, 1e-9);
            } else {
                const int exact = !strcmp(it->string, "loss") || !strcmp(it->string, "grad_norm");
                const double e = fabs(x - y) / (fabs(y) + (exact ? 0 : 0.1));
                if (exact)
                    worst_loss = fmax(worst_loss, e);
                else
                    worst_metric = fmax(worst_metric, e);
                CHECK_MSG(e <= 1e-4, "%s step %d: %s = %.7g, TRL %.7g", name, step, it->string, x, y);
            }
            compared++;
        }
        steps++;
        cJSON_Delete(a), cJSON_Delete(b);
    }
    CHECK_EQ_INT(steps, 20);
    CHECK_MSG(compared >= 20 * 12, "%s: %d values compared", name, compared);
    printf("  %s: 20 steps, %d values; worst relative error loss/grad_norm %.2g, metrics %.2g\n", name,
           compared, worst_loss, worst_metric);
    free(ours), free(theirs);
}

TEST(kto) { run_case("kto"); }
TEST(kto_weights_precompute_ga) { run_case("kto_weights_precompute_ga"); }
TEST(apo_zero_unpaired) { run_case("apo_zero_unpaired"); }
