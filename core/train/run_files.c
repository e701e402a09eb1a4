/* The files a run config names (run_files.h): checked as training will open them, so that a typo
 * in a path is found by `ctrl config check` rather than after the model has loaded. Hub model ids
 * of [model] and [teacher] are already resolved to their snapshot directory by the settings. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <ctrl/config.h>

#include "dataset/dataset_files.h"
#include "hub_cache.h"
#include "model/model_config.h"
#include "train/run_files.h"

typedef struct problems {
    int n;
    char text[3800];
} problems;

static void problem(problems *pr, const ctrl_config *cfg, const char *section, const char *key,
                    const char *what) {
    const size_t len = strlen(pr->text);
    snprintf(pr->text + len, sizeof pr->text - len, "%s%s: [%s] %s = %s: %s", pr->n++ ? "\n" : "",
             ctrl_config_where(cfg, section, key), section, key, ctrl_config_get_string(cfg, section, key),
             what);
}

static void check_model_dir(const ctrl_config *cfg, const char *section, problems *pr) {
    const char *v = ctrl_config_get_string(cfg, section, "path");
    if (!v) return;
    char buf[4096]; /* a reward model's Hub id is resolved when it loads: as it will be */
    const char *dir = ctrl_hub_resolve(v, buf, sizeof buf);
    struct stat sb;
    ctrl_model_config mc;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        problem(pr, cfg, section, "path",
                "no such model directory (nor a Hub id in the local Hugging Face cache)");
    else if (ctrl_model_config_load(dir, &mc) != CTRL_OK)
        problem(pr, cfg, section, "path", ctrl_error_message());
}

static void check_file(const ctrl_config *cfg, const char *section, const char *key, const char *inside,
                       problems *pr) {
    const char *v = ctrl_config_get_string(cfg, section, key);
    if (!v || (inside && !strcmp(inside, "trainer_state.json") && !strcmp(v, "last"))) return;
    char path[4400], what[4500];
    snprintf(path, sizeof path, "%s%s%s", v, inside ? "/" : "", inside ? inside : "");
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(what, sizeof what, "%s: no such file", path);
        problem(pr, cfg, section, key, what);
    }
}

static void check_data(const ctrl_config *cfg, const char *key, const char *split_key, problems *pr) {
    const char *v = ctrl_config_get_string(cfg, "data", key);
    if (!v) return;
    ctrl_data_files files;
    if (ctrl_data_files_find_in(v, ctrl_config_get_string(cfg, "data", "subset"),
                                ctrl_config_get_string(cfg, "data", split_key), &files) != CTRL_OK) {
        problem(pr, cfg, "data", key, ctrl_error_message());
        return;
    }
    ctrl_data_files_free(&files);
}

ctrl_status ctrl_run_files_check(const ctrl_config *cfg) {
    problems pr = {0};
    check_model_dir(cfg, "model", &pr);
    check_model_dir(cfg, "teacher", &pr);
    for (int i = 0; i < ctrl_config_section_count(cfg); i++) { /* [reward.NAME] path: a reward model */
        const char *sec = ctrl_config_section_at(cfg, i);
        if (sec && !strncmp(sec, "reward.", 7)) check_model_dir(cfg, sec, &pr);
    }
    check_file(cfg, "peft", "adapter_path", "adapter_config.json", &pr);
    check_data(cfg, "train_file", "split", &pr);
    check_data(cfg, "eval_file", "eval_split", &pr);
    check_file(cfg, "data", "chat_template_path", NULL, &pr);
    check_file(cfg, "train", "resume_from_checkpoint", "trainer_state.json", &pr);
    return pr.n ? ctrl_error_set(CTRL_ERR_CONFIG, "%s", pr.text) : CTRL_OK;
}
