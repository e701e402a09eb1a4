/* Good configs: typed values, defaults filled in, overrides applied, plugin sections, the
 * effective config round-trip, and the reference output. */
#include "config_test_support.h"
#include "test.h"

static const char *good_ini = "; a complete run\n"
                              "[run]\n"
                              "trainer = dpo\n"
                              "output_dir = /tmp/ctrl-config-test-run\n"
                              "seed = 7\n"
                              "[model]\n"
                              "path = some/model  ; inline comment\n"
                              "attention = eager\n"
                              "[data]\n"
                              "packing = yes\n"
                              "dataset_text_field = \"body # not a comment\"\n"
                              "[train]\n"
                              "optimizer = adamw\n"
                              "learning_rate = 5e-7\n"
                              "max_steps = 100\n"
                              "[memory]\n"
                              "strategies = checkpointing, offload\n"
                              "[dpo]\n"
                              "beta = 0.25\n"
                              "[adamw]\n"
                              "adam_beta1 = 0.8\n"
                              "[reward.len]\n"
                              "plugin = length\n"
                              "weight = 0.5\n"
                              "target_length = 64\n";

TEST(values_defaults_and_where) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("good.ini", good_ini, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        return;
    }
    CHECK_STR(ctrl_config_get_string(cfg, "run", "trainer"), "dpo");
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "run", "seed", -1), 7);
    CHECK_STR(ctrl_config_get_string(cfg, "model", "path"), "some/model");
    CHECK_STR(ctrl_config_get_string(cfg, "data", "dataset_text_field"), "body # not a comment");
    CHECK(ctrl_config_get_bool(cfg, "data", "packing", false));
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 5e-7, 1e-20);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "max_steps", 0), 100);
    /* Defaults: core, selected plugins, reward instances. */
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "gradient_accumulation_steps", 0), 1);
    CHECK_STR(ctrl_config_get_string(cfg, "train", "lr_scheduler_type"), "linear");
    CHECK_STR(ctrl_config_where(cfg, "train", "lr_scheduler_type"), "default");
    CHECK_NEAR(ctrl_config_get_float(cfg, "dpo", "beta", 0), 0.25, 1e-12);
    CHECK_NEAR(ctrl_config_get_float(cfg, "adamw", "adam_beta1", 0), 0.8, 1e-12);
    CHECK_NEAR(ctrl_config_get_float(cfg, "reward.len", "weight", 0), 0.5, 1e-12);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "reward.len", "target_length", 0), 64);
    CHECK_STR(ctrl_config_get_string(cfg, "reward.len", "unit"), "chars");
    /* Where each value came from. */
    char want[600];
    snprintf(want, sizeof want, "%s:15", file);
    CHECK_STR(ctrl_config_where(cfg, "train", "max_steps"), want);
    CHECK(!ctrl_config_has(cfg, "train", "no_such_key"));
    CHECK(ctrl_config_get_string(cfg, "data", "train_file") == NULL); /* no default, absent */
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(overrides) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("over.ini", good_ini, 0);
    const char *sets[] = {"train.learning_rate=1e-3", "reward.len.weight=2", "TRAIN.Max_Steps=5",
                          "generation.top_k=50"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 4, reg, &cfg), CTRL_OK);
    if (!cfg) return;
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 1e-3, 1e-15);
    CHECK_NEAR(ctrl_config_get_float(cfg, "reward.len", "weight", 0), 2.0, 1e-15);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "max_steps", 0), 5);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "generation", "top_k", 0), 50);
    CHECK_STR(ctrl_config_where(cfg, "train", "learning_rate"), "--set train.learning_rate");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Loading resolves the selected plugins once (the loops never look one up by name) and reads the
 * typed settings the loops use, overrides and defaults included. */
TEST(resolved_plugins_and_typed_settings) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("resolved.ini", good_ini, 0);
    const char *sets[] = {"reward.len.weight=2", "generation.mode=server",
                          "train.per_device_train_batch_size=3"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 3, reg, &cfg), CTRL_OK);
    if (!cfg) return;
    const ctrl_run_plugins *p = ctrl_config_plugins(cfg);
    CHECK_STR(p->trainer->name, "dpo");
    CHECK(p->trainer == ctrl_registry_find(reg, CTRL_KIND_TRAINER, "dpo")->plugin);
    CHECK_STR(p->optimizer->name, "adamw");
    CHECK_STR(p->attention->name, "eager");
    CHECK(p->decoder && !strcmp(p->decoder->name, "paged")); /* [generation] attention's default */
    CHECK_EQ_INT(p->n_memory, 2);
    CHECK_STR(p->memory[0]->name, "checkpointing");
    CHECK_STR(p->memory[1]->name, "offload");
    CHECK_EQ_INT(p->n_rewards, 1);
    CHECK_STR(p->reward[0].section, "reward.len");
    CHECK_STR(p->reward[0].name, "len");
    CHECK_STR(p->reward[0].plugin->name, "length");
    CHECK_NEAR(p->reward[0].weight, 2.0, 0);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    CHECK_STR(s->run.trainer, "dpo");
    CHECK_EQ_INT(s->run.seed, 7);
    CHECK_STR(s->run.output_dir, "/tmp/ctrl-config-test-run");
    CHECK_STR(s->model.path, "some/model");
    CHECK_NEAR(s->train.learning_rate, 5e-7, 1e-20);
    CHECK_EQ_INT(s->train.max_steps, 100);
    CHECK_EQ_INT(s->train.per_device_train_batch_size, 3);
    CHECK_EQ_INT(s->train.gradient_accumulation_steps, 1); /* defaults */
    CHECK_STR(s->train.lr_scheduler_type, "linear");
    CHECK_NEAR(s->train.max_grad_norm, 1.0, 0);
    CHECK(s->train.resume_from_checkpoint == NULL);
    CHECK(s->data.shuffle);
    CHECK(s->data.train_file == NULL);
    CHECK(s->data.packing);
    CHECK_STR(s->data.dataset_text_field, "body # not a comment");
    CHECK_EQ_INT(s->data.eval_packing, -1);         /* unset: follows packing */
    CHECK_EQ_INT(s->data.completion_only_loss, -1); /* auto */
    CHECK_EQ_INT(s->data.max_length, 1024);
    CHECK_STR(s->data.packing_strategy, "bfd");
    CHECK(s->generation.server);
    CHECK_NEAR(s->generation.temperature, 1.0, 0);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Without the default decoder loaded a run config still loads (only a run that decodes needs it);
 * named explicitly, an unloaded one is a config error. */
TEST(decoder_resolved_only_when_loaded) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("decoder.ini", "[model]\npath = m\nattention = flash\n", 0);
    const char *sets[] = {"generation.attention=eager"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 1, reg, &cfg), CTRL_OK);
    if (cfg) CHECK_STR(ctrl_config_plugins(cfg)->decoder->name, "eager");
    ctrl_config_free(cfg);
    cfg = NULL;
    const char *bad[] = {"generation.attention=nope"};
    CHECK_EQ_INT(ctrl_config_load(path, bad, 1, reg, &cfg), CTRL_ERR_CONFIG);
    CHECK(strstr(ctrl_error_message(), "[generation] attention = 'nope'") != NULL);
    ctrl_registry_destroy(reg);
}

TEST(default_output_dir_and_selected_plugin_defaults) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("my-run.ini", "[model]\npath = m\nattention = flash\n", 0);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) return;
    CHECK_STR(ctrl_config_get_string(cfg, "run", "output_dir"), "runs/my-run");
    CHECK_STR(ctrl_config_get_string(cfg, "run", "trainer"), "sft");
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "attention.flash", "block_q", 0), 64);
    CHECK_NEAR(ctrl_config_get_float(cfg, "adamw", "adam_beta1", 0), 0.9, 1e-12);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(effective_config_round_trip) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("round.ini", good_ini, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    const char *sets[] = {"train.learning_rate=1e-3"};
    ctrl_config *a = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, sets, 1, reg, &a), CTRL_OK);
    if (!a) return;
    char out[600];
    snprintf(out, sizeof out, "%s.effective.ini", file);
    CHECK_EQ_INT(ctrl_config_write_effective(a, out), CTRL_OK);
    CHECK_EQ_INT(ctrl_config_load(out, NULL, 0, reg, &b), CTRL_OK);
    if (!b) {
        printf("  reload: %s\n", ctrl_error_message());
        ctrl_config_free(a);
        return;
    }
    static const char *const keys[][2] = {
        {"run", "trainer"},
        {"run", "seed"},
        {"model", "path"},
        {"data", "packing"},
        {"data", "dataset_text_field"},
        {"train", "learning_rate"},
        {"train", "max_steps"},
        {"train", "weight_decay"},
        {"memory", "strategies"},
        {"dpo", "beta"},
        {"adamw", "adam_beta1"},
        {"reward.len", "plugin"},
        {"reward.len", "unit"},
        {"generation", "mode"},
        {"peft", "target_modules"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK_STR(ctrl_config_get_string(b, keys[i][0], keys[i][1]),
                  ctrl_config_get_string(a, keys[i][0], keys[i][1]));
    ctrl_config_free(a);
    ctrl_config_free(b);
    ctrl_registry_destroy(reg);
}

/* The config reference of reg as text (free it); its length in *len. */
static char *reference_text(ctrl_registry *reg, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    CHECK_EQ_INT(ctrl_config_reference_write(reg, f), CTRL_OK);
    fclose(f);
    return buf;
}

/* What `ctrl plugins describe` prints of an option table, as text (free it). */
static char *option_table_text(const ctrl_option *options) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ctrl_option_table_print(f, options);
    fclose(f);
    return buf;
}

TEST(reference_and_describe) {
    ctrl_registry *reg = test_registry();
    size_t len = 0;
    char *buf = reference_text(reg, &len);
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) {
        char h[64];
        snprintf(h, sizeof h, "### [%s]", s->name);
        CHECK_CONTAINS(buf, h);
    }
    CHECK_CONTAINS(buf, "| `learning_rate` | float | `2e-5` | > 0 |");
    CHECK_CONTAINS(buf, "### trainer/dpo — section `[dpo]`");
    CHECK_CONTAINS(buf, "### attention/flash — section `[attention.flash]`");
    CHECK_CONTAINS(buf, "### reward/length — in `[reward.NAME]` with `plugin = length`");
    free(buf);
    buf = option_table_text(t_length_options);
    CHECK_CONTAINS(buf, "target_length");
    CHECK_CONTAINS(buf, "chars|tokens");
    free(buf);
    ctrl_registry_destroy(reg);
}

/* What the file syntax accepts besides the plain form: CRLF line ends, upper-case names (lower-cased
 * as iniparser does), both quote kinds, empty quoted values, comments after values. */
TEST(syntax_variants) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("variants.ini",
                                 "; comment\r\n"
                                 "# another\r\n"
                                 "[RUN]\r\n"
                                 "Seed = 11 ; inline\r\n"
                                 "  [ model ]  \r\n"
                                 "PATH = 'dir with spaces/m' # inline\r\n"
                                 "[data]\r\n"
                                 "dataset_text_field = \"\"\r\n"
                                 "train_file = \"a;b#c.jsonl\"\r\n"
                                 "eval_file = x=y.jsonl\r\n",
                                 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        ctrl_registry_destroy(reg);
        return;
    }
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "run", "seed", 0), 11);
    CHECK_STR(ctrl_config_get_string(cfg, "model", "path"), "dir with spaces/m");
    CHECK_STR(ctrl_config_get_string(cfg, "data", "dataset_text_field"), "");
    CHECK_STR(ctrl_config_get_string(cfg, "data", "train_file"), "a;b#c.jsonl");
    CHECK_STR(ctrl_config_get_string(cfg, "data", "eval_file"), "x=y.jsonl");
    char want[600];
    snprintf(want, sizeof want, "%s:6", file);
    CHECK_STR(ctrl_config_where(cfg, "model", "path"), want);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* --set: spaces around names and values dropped, names lower-cased, a section created by --set
 * alone, later overrides of the same key win, and the accessors read the types. */
TEST(override_forms) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("forms.ini", BASE_INI, 0);
    const char *sets[] = {
        " train.learning_rate = 3e-4 ", "Run.Seed=1",      "run.seed=2",       "reward.short.plugin=length",
        "reward.short.unit=tokens",     "data.packing=ON", "run.device=cuda:3"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 7, reg, &cfg), CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        ctrl_registry_destroy(reg);
        return;
    }
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 3e-4, 1e-18);
    CHECK_STR(ctrl_config_where(cfg, "train", "learning_rate"), "--set train.learning_rate");
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "run", "seed", 0), 2);
    CHECK_STR(ctrl_config_get_string(cfg, "reward.short", "unit"), "tokens");
    CHECK_NEAR(ctrl_config_get_float(cfg, "reward.short", "weight", 0), 1.0, 0); /* default */
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "reward.short", "target_length", 0), 20);
    CHECK(ctrl_config_get_bool(cfg, "data", "packing", false));
    CHECK_STR(ctrl_config_get_string(cfg, "run", "device"), "cuda:3");
    /* Typed reads of a value of another type give the fallback, not garbage. */
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "run", "device", -7), -7);
    CHECK(ctrl_config_get_bool(cfg, "run", "trainer", true));
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Every declared default of the core passes its own checks, and a config of defaults only holds
 * every core key with "default" as its origin (except what the file set). */
TEST(core_defaults_complete) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("minimal.ini", "[model]\npath = m\n", 0);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) {
        ctrl_registry_destroy(reg);
        return;
    }
    int n = 0;
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        for (const ctrl_option *o = s->options; o->key; o++) {
            CHECK_MSG(o->doc && o->doc[0], "[%s] %s has no doc string", s->name, o->key);
            if (!o->default_value) continue;
            CHECK_MSG(ctrl_config_has(cfg, s->name, o->key), "[%s] %s: default not filled in", s->name,
                      o->key);
            if (strcmp(s->name, "model") || strcmp(o->key, "path"))
                CHECK_STR(ctrl_config_where(cfg, s->name, o->key), "default");
            n++;
        }
    CHECK(n > 50);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "data", "max_length", 0), 1024);
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 2e-5, 1e-20);
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "num_train_epochs", 0), 3, 0);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "max_steps", 0), -1);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "per_device_train_batch_size", 0), 8);
    CHECK(ctrl_config_get_bool(cfg, "data", "padding_free", false));
    CHECK(!ctrl_config_get_bool(cfg, "peft", "enabled", true));
    CHECK_STR(ctrl_config_get_string(cfg, "data", "packing_strategy"), "bfd");
    CHECK_STR(ctrl_config_get_string(cfg, "memory", "strategies"), "checkpointing");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

/* Values that need quoting in INI (comment characters, quotes, a trailing backslash) come back
 * unchanged; one that INI cannot hold (both quote kinds and a ';') is refused, not mangled, and no
 * file is left behind. Origins are written as comments. */
TEST(effective_config_quoting) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("quoting.ini", BASE_INI, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    const char *sets[] = {"data.train_file=a;b#c.jsonl", "data.eval_file=C:\\data\\",
                          "data.dataset_text_field=it's", "run.output_dir=say \"hi\" there"};
    ctrl_config *a = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, sets, 4, reg, &a), CTRL_OK);
    if (!a) {
        ctrl_registry_destroy(reg);
        return;
    }
    char out[600];
    snprintf(out, sizeof out, "%s.effective.ini", file);
    CHECK_EQ_INT(ctrl_config_write_effective(a, out), CTRL_OK);
    char *text = read_all(out);
    CHECK_CONTAINS(text, "learning_rate = 2e-5  ; default");
    CHECK_CONTAINS(text, "train_file = \"a;b#c.jsonl\"  ; --set data.train_file");
    free(text);
    CHECK_EQ_INT(ctrl_config_load(out, NULL, 0, reg, &b), CTRL_OK);
    if (b) {
        for (int i = 0; i < 4; i++) {
            char sec[64];
            const char *dot = strchr(sets[i], '.'), *eq = strchr(sets[i], '=');
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - sets[i]), sets[i]);
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
            CHECK_STR(ctrl_config_get_string(b, sec, key), eq + 1);
        }
        ctrl_config_free(b);
    } else {
        printf("  reload: %s\n", ctrl_error_message());
    }
    ctrl_config_free(a);
    const char *bad[] = {"data.train_file=a'b\"c;d"};
    CHECK_EQ_INT(ctrl_config_load(file, bad, 1, reg, &a), CTRL_OK);
    if (a) {
        char out2[600];
        snprintf(out2, sizeof out2, "%s.bad.ini", file);
        CHECK_EQ_INT(ctrl_config_write_effective(a, out2), CTRL_ERR_CONFIG);
        CHECK_CONTAINS(ctrl_error_message(), "--set data.train_file");
        CHECK_CONTAINS(ctrl_error_message(), "both kinds of quote");
        CHECK(access(out2, F_OK) != 0);
        ctrl_config_free(a);
    }
    /* Unwritable destination: an I/O error naming the path. */
    const char *sets2[] = {"train.max_steps=3"};
    CHECK_EQ_INT(ctrl_config_load(file, sets2, 1, reg, &a), CTRL_OK);
    if (a) {
        CHECK_EQ_INT(ctrl_config_write_effective(a, "/nonexistent-dir/config.ini"), CTRL_ERR_IO);
        CHECK_CONTAINS(ctrl_error_message(), "/nonexistent-dir/config.ini");
        ctrl_config_free(a);
    }
    ctrl_registry_destroy(reg);
}

/* Every key of every section of the effective config reads back identically. */
TEST(effective_config_round_trip_every_key) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("every.ini", good_ini, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    ctrl_config *a = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &a), CTRL_OK);
    if (!a) {
        ctrl_registry_destroy(reg);
        return;
    }
    char out[600];
    snprintf(out, sizeof out, "%s.effective.ini", file);
    CHECK_EQ_INT(ctrl_config_write_effective(a, out), CTRL_OK);
    CHECK_EQ_INT(ctrl_config_load(out, NULL, 0, reg, &b), CTRL_OK);
    if (b) {
        int n = 0;
        for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
            for (const ctrl_option *o = s->options; o->key; o++, n++)
                CHECK_MSG((ctrl_config_get_string(a, s->name, o->key) == NULL) ==
                                  (ctrl_config_get_string(b, s->name, o->key) == NULL) &&
                              (!ctrl_config_get_string(a, s->name, o->key) ||
                               !strcmp(ctrl_config_get_string(a, s->name, o->key),
                                       ctrl_config_get_string(b, s->name, o->key))),
                          "[%s] %s differs after the round trip", s->name, o->key);
        static const char *const plugin_keys[][2] = {
            {"dpo", "beta"},          {"adamw", "adam_beta1"},  {"attention.eager", NULL},
            {"reward.len", "plugin"}, {"reward.len", "weight"}, {"reward.len", "target_length"},
            {"reward.len", "unit"}};
        for (size_t i = 0; i < sizeof plugin_keys / sizeof plugin_keys[0]; i++) {
            if (!plugin_keys[i][1]) continue;
            CHECK_STR(ctrl_config_get_string(b, plugin_keys[i][0], plugin_keys[i][1]),
                      ctrl_config_get_string(a, plugin_keys[i][0], plugin_keys[i][1]));
        }
        CHECK(n > 50);
        ctrl_config_free(b);
    }
    ctrl_config_free(a);
    ctrl_registry_destroy(reg);
}

/* The reference is deterministic and lists plugins sorted by kind, then name. */
TEST(reference_deterministic_and_sorted) {
    ctrl_registry *reg = test_registry();
    size_t n1 = 0, n2 = 0;
    char *one = reference_text(reg, &n1), *two = reference_text(reg, &n2);
    CHECK(n1 == n2 && !memcmp(one, two, n1));
    const char *adamw = strstr(one, "### optimizer/adamw"), *sgd = strstr(one, "### optimizer/sgd");
    const char *eager = strstr(one, "### attention/eager"), *flash = strstr(one, "### attention/flash");
    CHECK(adamw && sgd && adamw < sgd);
    CHECK(eager && flash && eager < flash);
    CHECK_CONTAINS(one, "### [reward.NAME]");
    CHECK_CONTAINS(one, "| `path` | path | (required) |");
    CHECK_CONTAINS(one, "trace\\|debug"); /* '|' escaped inside table cells */
    free(one);
    free(two);
    ctrl_registry_destroy(reg);
}

/* `ctrl plugins describe`: one header and one line per key, columns aligned even with choices
 * wider than the header. */
static const ctrl_option t_wide_options[] = {
    {.key = "k",
     .type = CTRL_OPT_INT,
     .default_value = "1",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "target"},
    {.key = "mode",
     .type = CTRL_OPT_CHOICE,
     .default_value = "alpha",
     .choices = "alpha|beta|gamma|delta|epsilon|zeta",
     .doc = "unit"},
    CTRL_OPTION_END,
};

TEST(option_table_print_aligned) {
    char *buf = option_table_text(t_wide_options);
    CHECK_CONTAINS(buf, "KEY");
    CHECK_CONTAINS(buf, "DEFAULT");
    int lines = 0, doc_col = -1, aligned = 1;
    for (char *line = buf; line && *line; lines++) {
        char *nl = strchr(line, '\n');
        /* The doc column: "DOC" in the header, the doc strings ("target", "unit") below. */
        const char *doc = strstr(line, lines == 0 ? "DOC" : (lines == 1 ? "target\n" : "unit\n"));
        int col = doc ? (int)(doc - line) : -2;
        if (doc_col == -1) doc_col = col;
        if (col != doc_col || col < 0) aligned = 0;
        line = nl ? nl + 1 : NULL;
    }
    CHECK_EQ_INT(lines, 3);
    CHECK(aligned);
    free(buf);
    buf = option_table_text(NULL); /* a plugin without options: header only, no crash */
    CHECK_CONTAINS(buf, "KEY");
    free(buf);
}

/* Enumerating sections (the core finds every [reward.NAME] this way) and reading list values. */
TEST(sections_and_lists) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("lists.ini",
                                 "[reward.b]\nplugin = length\n[model]\npath = m\n[memory]\n"
                                 "strategies = offload,checkpointing\n[reward.a]\nplugin = length\n"
                                 "[peft]\nenabled = true\ntarget_modules = q_proj v_proj,, o_proj\n",
                                 0);
    const char *sets[] = {"reward.c.plugin=length"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 1, reg, &cfg), CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        ctrl_registry_destroy(reg);
        return;
    }
    int n = ctrl_config_section_count(cfg), rewards = 0;
    const char *order[3] = {0};
    for (int i = 0; i < n; i++) {
        const char *s = ctrl_config_section_at(cfg, i);
        CHECK(s != NULL);
        if (s && !strncmp(s, "reward.", 7) && rewards < 3) order[rewards++] = s;
    }
    CHECK(ctrl_config_section_at(cfg, n) == NULL);
    CHECK(ctrl_config_section_at(cfg, -1) == NULL);
    CHECK_EQ_INT(rewards, 3);
    CHECK_STR(order[0], "reward.b"); /* file order, then --set */
    CHECK_STR(order[1], "reward.a");
    CHECK_STR(order[2], "reward.c");
    CHECK_STR(ctrl_config_section_at(cfg, 1), "model");
    char buf[32];
    CHECK_EQ_INT(ctrl_config_list_count(cfg, "memory", "strategies"), 2);
    CHECK_STR(ctrl_config_list_item(cfg, "memory", "strategies", 0, buf, sizeof buf), "offload");
    CHECK_STR(ctrl_config_list_item(cfg, "memory", "strategies", 1, buf, sizeof buf), "checkpointing");
    CHECK(ctrl_config_list_item(cfg, "memory", "strategies", 2, buf, sizeof buf) == NULL);
    CHECK(ctrl_config_list_item(cfg, "memory", "strategies", 1, buf, 5) == NULL); /* does not fit */
    CHECK_EQ_INT(ctrl_config_list_count(cfg, "peft", "target_modules"), 3);
    CHECK_STR(ctrl_config_list_item(cfg, "peft", "target_modules", 2, buf, sizeof buf), "o_proj");
    CHECK_EQ_INT(ctrl_config_list_count(cfg, "nope", "nothing"), 0);
    ctrl_config_free(cfg);
    /* An empty list has no items. */
    path = write_ini("nolist.ini", "[model]\npath = m\n[memory]\nstrategies =\n", 0);
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_OK);
    if (cfg) {
        CHECK_EQ_INT(ctrl_config_list_count(cfg, "memory", "strategies"), 0);
        CHECK(ctrl_config_list_item(cfg, "memory", "strategies", 0, buf, sizeof buf) == NULL);
        ctrl_config_free(cfg);
    }
    ctrl_registry_destroy(reg);
}
