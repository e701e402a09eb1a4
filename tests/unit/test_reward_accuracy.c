/* The `accuracy` reward plugin against math_verify's verify(parse(solution), parse(completion))
 * on 590 cases (tests/reference/make_accuracy_fixtures.py): plain, worded and "####" answers,
 * \boxed answers, fractions, negatives, decimals, thousands commas, wrong answers, no answer, and
 * solutions with no answer (NaN: the reward does not apply). Also where TRL's stricter
 * accuracy_reward agrees (boxed completions). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <ctrl/reward.h>

#include "file_text.h"
#include "test.h"
#include "test_registry.h"

TEST(accuracy_matches_math_verify) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "acc.ini",
                                             "[model]\npath = m\n[memory]\nstrategies =\n"
                                             "[reward.acc]\nplugin = accuracy\n"
                                             "[reward.other]\nplugin = accuracy\ncolumn = answer\n");
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_REWARD, "accuracy");
    CHECK(e && cfg);
    if (!e || !cfg) return;
    const ctrl_reward_ops *ops = e->plugin->ops;
    ctrl_reward *r = NULL, *other = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, "reward.acc", &r), CTRL_OK);
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, "reward.other", &other), CTRL_OK);

    char path[1024];
    snprintf(path, sizeof path, "%s/reward/accuracy.jsonl", CTRL_FIXTURE_DIR);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 24, &st);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    if (!text) return;
    enum { CAP = 1024 };
    const char *completions[CAP], *solutions[CAP];
    char *owned[CAP];
    float want[CAP], trl[CAP], got[CAP];
    cJSON *rows[CAP];
    int n = 0;
    char *save;
    for (char *line = strtok_r(text, "\n", &save); line && n < CAP; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        rows[n] = o;
        completions[n] = cJSON_GetObjectItem(o, "completion")->valuestring;
        owned[n] = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "solution")); /* the column as JSON text */
        solutions[n] = owned[n];
        const cJSON *x = cJSON_GetObjectItem(o, "expected"), *y = cJSON_GetObjectItem(o, "trl");
        want[n] = cJSON_IsNumber(x) ? (float)x->valuedouble : NAN;
        trl[n] = cJSON_IsNumber(y) ? (float)y->valuedouble : NAN;
        n++;
    }
    const ctrl_reward_column col = {.name = "solution", .values = solutions};
    const ctrl_reward_batch b = {
        .size = sizeof b, .n = n, .completions = completions, .n_columns = 1, .columns = &col};
    CHECK_EQ_INT(ops->score(r, &b, got), CTRL_OK);
    int agree = 0, boxed = 0, boxed_agree = 0;
    for (int i = 0; i < n; i++) {
        const int same = (isnan(want[i]) && isnan(got[i])) || want[i] == got[i];
        agree += same;
        CHECK_MSG(same, "completion '%s' vs solution %s: %g, math_verify %g", completions[i], solutions[i],
                  got[i], want[i]);
        if (strstr(completions[i], "\\boxed")) boxed++, boxed_agree += trl[i] == got[i];
    }
    CHECK_EQ_INT(boxed_agree, boxed);
    printf("  %d/%d cases as math_verify; %d/%d boxed completions as TRL's accuracy_reward\n", agree, n,
           boxed_agree, boxed);
    /* a row without the column: the reward does not apply */
    CHECK_EQ_INT(ops->score(other, &b, got), CTRL_OK);
    CHECK(isnan(got[0]) && isnan(got[n - 1]));
    ops->destroy(r), ops->destroy(other);
    for (int i = 0; i < n; i++) cJSON_free(owned[i]), cJSON_Delete(rows[i]);
    free(text);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* `column =` (empty) names no column: refused naming the key (it used to fall back silently to
 * "solution", restating the option table's default). */
TEST(an_empty_column_is_refused) {
    ctrl_registry *reg = test_plugin_registry();
    test_config_refused(
        reg, "acc_empty.ini",
        "[model]\npath = m\n[memory]\nstrategies =\n[reward.acc]\nplugin = accuracy\ncolumn =\n",
        "acc_empty.ini:7: [reward.acc] column");
    ctrl_registry_destroy(reg);
}
