/* Atomic training checkpoints and resume. */
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <ftw.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "file_text.h"
#include "train/train_lora.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"

static ctrl_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    int bad = fsync(fd) != 0;
    close(fd);
    return bad ? ctrl_error_set(CTRL_ERR_IO, "%s: fsync failed", path) : CTRL_OK;
}

ctrl_status ctrl_copy_file(const char *a, const char *b, int *missing) {
    FILE *in = fopen(a, "rb");
    if (missing) *missing = !in;
    if (!in) return missing ? CTRL_OK : ctrl_error_set(CTRL_ERR_IO, "%s: %s", a, strerror(errno));
    FILE *out = fopen(b, "wb");
    if (!out) {
        fclose(in);
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", b, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int bad = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) bad |= fwrite(buf, 1, n, out) != n;
    bad |= ferror(in) != 0;
    fclose(in);
    bad |= fflush(out) != 0 || fsync(fileno(out)) != 0;
    if (fclose(out) != 0 || bad) return ctrl_error_set(CTRL_ERR_IO, "%s: write failed", b);
    return CTRL_OK;
}

ctrl_status ctrl_copy_tokenizer_files(const char *from, const char *to) {
    /* what a tokenizer's save_pretrained writes, with the slow tokenizers' vocabulary files */
    static const char *const files[] = {
        "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
        "chat_template.jinja", "added_tokens.json",     "vocab.json",
        "merges.txt",          "tokenizer.model"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/%s", from, files[i]);
        snprintf(b, sizeof b, "%s/%s", to, files[i]);
        int missing;
        ctrl_status st = ctrl_copy_file(a, b, &missing);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

ctrl_status ctrl_save_chat_template(const char *template_path, const char *to) {
    char b[4200];
    snprintf(b, sizeof b, "%s/chat_template.jinja", to);
    ctrl_status st = ctrl_copy_file(template_path, b, NULL);
    return st == CTRL_OK ? st : ctrl_error_wrap(st, "[data] chat_template_path");
}

/* A test hook (CTRL_TEST_SAVE_DELAY_MS): a pause between the files of a checkpoint, so that the
 * kill-mid-save test can hit the window it means to. */
static void test_pause(void) {
    const char *ms = getenv("CTRL_TEST_SAVE_DELAY_MS");
    if (!ms) return;
    struct timespec ts = {atol(ms) / 1000, (atol(ms) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int has_state_sync(const ctrl_optimizer_ops *ops) {
    return ops->size >= offsetof(ctrl_optimizer_ops, state_sync) + sizeof ops->state_sync && ops->state_sync;
}

void ctrl_checkpoint_state_key(char *key, size_t cap, int i, const char *name) {
    snprintf(key, cap, "%06d.%s", i, name);
}

ctrl_status ctrl_checkpoint_save_optimizer(const char *path, const ctrl_optimizer_ops *ops,
                                           ctrl_optimizer *opt) {
    const int n = ops->state_count ? ops->state_count(opt) : 0;
    ctrl_st_write *t = calloc((size_t)(n ? n : 1), sizeof *t);
    char(*names)[80] = calloc((size_t)(n ? n : 1), sizeof *names);
    ctrl_status st = t && names ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    if (st == CTRL_OK && has_state_sync(ops)) st = ops->state_sync(opt, 0); /* a device's state to the host */
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        const char *name;
        float *data;
        int64_t numel;
        st = ops->state_get(opt, i, &name, &data, &numel);
        ctrl_checkpoint_state_key(names[i], sizeof names[i], i, st == CTRL_OK ? name : "");
        t[i] = (ctrl_st_write){.name = names[i], .data = data, .ndim = 1, .shape = {numel}};
        const ctrl_dtype dt = ctrl_optimizer_state_dtype(ops, opt, i); /* adamw_8bit's u8 state: as is */
        if (dt != CTRL_F32) t[i].raw = data, t[i].raw_dtype = dt;
    }
    if (st == CTRL_OK) st = ctrl_safetensors_write(path, t, n, CTRL_F32);
    free(t), free(names);
    return st;
}

static ctrl_status write_state(const char *path, const ctrl_train_state *s) {
    cJSON *o = cJSON_CreateObject();
    /* global_step, epoch and max_steps as in transformers' trainer_state.json; the rest is ctrl's */
    cJSON_AddNumberToObject(o, "global_step", (double)s->step);
    cJSON_AddNumberToObject(o, "epoch", s->n_examples ? (double)s->cursor / (double)s->n_examples : 0);
    cJSON_AddNumberToObject(o, "max_steps", (double)s->max_steps);
    cJSON_AddNumberToObject(o, "cursor", (double)s->cursor);
    cJSON_AddNumberToObject(o, "train_examples", (double)s->n_examples);
    cJSON_AddNumberToObject(o, "num_tokens", (double)s->num_tokens);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddStringToObject(o, "optimizer", s->optimizer);
    /* the open logging window, as hex floats so that it round-trips exactly */
    const double w[4] = {s->win_loss, s->win_acc, s->win_norm, s->win_ent};
    static const char *const names[4] = {"window_loss", "window_accuracy", "window_grad_norm",
                                         "window_entropy"};
    for (int i = 0; i < 4; i++) {
        char hex[64];
        snprintf(hex, sizeof hex, "%a", w[i]);
        cJSON_AddStringToObject(o, names[i], hex);
    }
    cJSON_AddNumberToObject(o, "window_steps", s->win);
    cJSON_AddNumberToObject(o, "world_size", s->world_size > 0 ? s->world_size : 1);
    if (s->zero_stage > 0) cJSON_AddNumberToObject(o, "zero_stage", s->zero_stage);
    if (s->zero_stage > 0 && s->zero_layout) {
        char hex[24];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)s->zero_layout);
        cJSON_AddStringToObject(o, "zero_layout", hex);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = fopen(path, "w");
    if (!f) {
        cJSON_free(text);
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    }
    int bad = fputs(text, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0;
    cJSON_free(text);
    if (fclose(f) != 0 || bad) return ctrl_error_set(CTRL_ERR_IO, "%s: write failed", path);
    return CTRL_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Takes a checkpoint away: renamed to a temporary name first (atomic), then removed, so a kill
 * in the middle never leaves a partial checkpoint-STEP behind. Returns nonzero when `dir` was
 * there but could not be renamed. */
static int retire_tree(const char *dir) {
    char aside[4500];
    if (snprintf(aside, sizeof aside, "%s.tmp-old-%d", dir, (int)getpid()) >= (int)sizeof aside) return 1;
    if (rename(dir, aside) != 0) return errno != ENOENT;
    remove_tree(aside);
    return 0;
}

/* The step of a complete checkpoint directory name ("checkpoint-<digits>"), else -1. */
static long checkpoint_step(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    char *end;
    long v = strtol(name + 11, &end, 10);
    return *end ? -1 : v;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Complete checkpoints in out_dir, sorted by step; returns the count (malloc'd *steps), or -1 when
 * out of memory (then nothing is removed or resumed by a partial list). */
static int list_checkpoints(const char *out_dir, long **steps) {
    int n = 0, cap = 16;
    if (!(*steps = malloc(sizeof(long) * (size_t)cap))) return -1;
    DIR *d = opendir(out_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long s = checkpoint_step(e->d_name);
        char state[4400];
        snprintf(state, sizeof state, "%s/%s/trainer_state.json", out_dir, e->d_name);
        if (s < 0 || access(state, R_OK) != 0) continue;
        if (n == cap) {
            long *more = realloc(*steps, sizeof(long) * (size_t)(cap *= 2));
            if (!more) {
                closedir(d);
                return -1;
            }
            *steps = more;
        }
        (*steps)[n++] = s;
    }
    if (d) closedir(d);
    qsort(*steps, (size_t)n, sizeof(long), cmp_long);
    return n;
}

/* Temporary checkpoints a killed run left behind (never complete, never resumed from). */
static void remove_stale_tmp(const char *out_dir) {
    DIR *d = opendir(out_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "checkpoint-", 11) != 0 || !strstr(e->d_name, ".tmp-")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        remove_tree(path);
    }
    if (d) closedir(d);
}

ctrl_status ctrl_checkpoint_save(const char *out_dir, ctrl_model *m, const char *tokenizer_dir,
                                 const ctrl_optimizer_ops *ops, ctrl_optimizer *opt,
                                 const ctrl_train_state *s, const ctrl_checkpoint_shards *shards,
                                 const ctrl_checkpoint_extra *extra, int keep, char *written, size_t cap) {
    char final[4200], tmp[4300], path[4400];
    snprintf(final, sizeof final, "%s/checkpoint-%ld", out_dir, s->step);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", final, (int)getpid());
    remove_stale_tmp(out_dir);
    if (mkdir(tmp, 0777) != 0) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", tmp, strerror(errno));
    ctrl_status st = train_model_save(m, tmp, tokenizer_dir); /* with LoRA: the adapter only */
    if (shards && shards->model_written) {
        const ctrl_status e = shards->model_written(shards->user);
        st = st != CTRL_OK ? st : e;
    }
    test_pause();
    if (st == CTRL_OK) st = ctrl_copy_tokenizer_files(tokenizer_dir, tmp);
    if (!shards) {
        snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
        if (st == CTRL_OK) st = ctrl_checkpoint_save_optimizer(path, ops, opt);
    }
    for (int r = 0; shards && r < shards->n && st == CTRL_OK; r++) { /* ZeRO: each rank's slice */
        snprintf(path, sizeof path, "%s/optimizer.rank-%d.safetensors", tmp, r);
        st = r == 0 ? ctrl_checkpoint_save_optimizer(path, ops, opt) : shards->write(shards->user, r, path);
    }
    if (st == CTRL_OK && extra && extra->save) st = extra->save(extra->user, tmp);
    test_pause();
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp); /* last: it marks the checkpoint complete */
    if (st == CTRL_OK) st = write_state(path, s);
    if (st == CTRL_OK) st = fsync_path(tmp);
    /* a checkpoint of the same step from an earlier, resumed-over run goes first */
    if (st == CTRL_OK && retire_tree(final))
        st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot replace it: %s", final, strerror(errno));
    if (st == CTRL_OK && rename(tmp, final) != 0)
        st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", final, strerror(errno));
    if (st == CTRL_OK) st = fsync_path(out_dir);
    if (st != CTRL_OK) {
        remove_tree(tmp);
        return st;
    }
    if (written) snprintf(written, cap, "%s", final);
    if (keep > 0) { /* save_total_limit: the oldest go */
        long *steps;
        int n = list_checkpoints(out_dir, &steps);
        for (int i = 0; i + keep < n; i++) {
            snprintf(path, sizeof path, "%s/checkpoint-%ld", out_dir, steps[i]);
            retire_tree(path);
        }
        free(steps);
    }
    return CTRL_OK;
}

ctrl_status ctrl_checkpoint_resolve(const char *out_dir, const char *spec, char *path, size_t cap) {
    if (strcmp(spec, "last") != 0) {
        char state[4400];
        snprintf(state, sizeof state, "%s/trainer_state.json", spec);
        if (access(state, R_OK) != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "[train] resume_from_checkpoint = %s: not a complete checkpoint (no "
                                  "trainer_state.json)",
                                  spec);
        snprintf(path, cap, "%s", spec);
        return CTRL_OK;
    }
    if (!ctrl_checkpoint_last(out_dir, path, cap))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[train] resume_from_checkpoint = last: no complete checkpoint in %s", out_dir);
    return CTRL_OK;
}

int ctrl_checkpoint_last(const char *out_dir, char *path, size_t cap) {
    long *steps;
    int n = list_checkpoints(out_dir, &steps);
    if (n > 0) snprintf(path, cap, "%s/checkpoint-%ld", out_dir, steps[n - 1]);
    free(steps);
    return n > 0;
}

/* A non-negative integer (exact in a double), else -1: the file is untrusted. */
static int get_long(const cJSON *o, const char *key, long *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= 9007199254740992.0) ||
        j->valuedouble != (double)(long)j->valuedouble)
        return -1;
    *v = (long)j->valuedouble;
    return 0;
}

static int get_hex(const cJSON *o, const char *key, double *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(j)) return -1;
    char *end;
    *v = strtod(j->valuestring, &end);
    return *end || end == j->valuestring || !isfinite(*v) ? -1 : 0;
}

ctrl_status ctrl_checkpoint_load_state(const char *dir, const char *optimizer, const ctrl_optimizer_ops *ops,
                                       ctrl_optimizer *opt, int zero_stage, int rank, ctrl_train_state *s) {
    const int world_size = s->world_size > 0 ? s->world_size : 1; /* this run's: the file's must equal it */
    const uint64_t layout = s->zero_layout;                       /* this run's ZeRO slices */
    uint64_t made_layout = 0;
    char path[4400];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    if (!text) return st;
    cJSON *o = cJSON_Parse(text);
    free(text);
    long win = 0;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(o, "seed");
    const cJSON *made_with = cJSON_GetObjectItemCaseSensitive(o, "optimizer");
    /* the first key that is missing or wrong, for the message */
    const char *bad = !o                                                   ? "valid JSON"
                      : get_long(o, "global_step", &s->step)               ? "global_step"
                      : get_long(o, "cursor", &s->cursor)                  ? "cursor"
                      : get_long(o, "num_tokens", &s->num_tokens)          ? "num_tokens"
                      : get_long(o, "train_examples", &s->n_examples)      ? "train_examples"
                      : !cJSON_IsString(seed)                              ? "seed"
                      : !cJSON_IsString(made_with)                         ? "optimizer"
                      : get_hex(o, "window_loss", &s->win_loss)            ? "window_loss"
                      : get_hex(o, "window_accuracy", &s->win_acc)         ? "window_accuracy"
                      : get_hex(o, "window_grad_norm", &s->win_norm)       ? "window_grad_norm"
                      : get_hex(o, "window_entropy", &s->win_ent)          ? "window_entropy"
                      : get_long(o, "window_steps", &win) || win > s->step ? "window_steps"
                                                                           : NULL;
    if (!bad) {
        s->seed = strtoull(seed->valuestring, NULL, 10), s->win = (int)win;
        long ranks = 1; /* absent before data parallel */
        if (cJSON_HasObjectItem(o, "world_size") &&
            (get_long(o, "world_size", &ranks) || ranks < 1 || ranks > 1 << 20))
            bad = "world_size";
        s->world_size = (int)ranks;
        long stage = 0; /* absent without ZeRO */
        if (cJSON_HasObjectItem(o, "zero_stage") &&
            (get_long(o, "zero_stage", &stage) || stage < 1 || stage > 3))
            bad = "zero_stage";
        s->zero_stage = (int)stage;
        const cJSON *zl = cJSON_GetObjectItemCaseSensitive(o, "zero_layout"); /* absent before buckets */
        if (zl && (!cJSON_IsString(zl) || sscanf(zl->valuestring, "%" SCNx64, &made_layout) != 1))
            bad = "zero_layout";
        snprintf(s->optimizer, sizeof s->optimizer, "%s", made_with->valuestring);
    }
    cJSON_Delete(o);
    if (bad)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a ctrl trainer state (%s: missing or invalid)", path,
                              bad);
    if (strcmp(s->optimizer, optimizer) != 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: made with optimizer '%s', [train] optimizer = %s: resume with the same "
                              "optimizer",
                              dir, s->optimizer, optimizer);
    if (s->world_size != world_size)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: made by %d rank(s), this run has %d: resume with the same number of ranks "
                              "(mpirun -np %d), which the data position and the batch depend on",
                              dir, s->world_size, world_size, s->world_size);
    if ((s->zero_stage > 0) != (zero_stage > 0))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: made %s ZeRO, [memory] strategies %s: resume with a ZeRO strategy as the "
                              "checkpoint was made or without",
                              dir, s->zero_stage ? "with" : "without", zero_stage ? "has one" : "has none");
    if (s->zero_stage > 0 && zero_stage > 0 && (s->zero_stage >= 3) != (zero_stage >= 3))
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: made with ZeRO-%d, [memory] strategies has zero%d: ZeRO-3 cuts the optimizer "
            "state in other slices than zero1 and zero2; resume with the checkpoint's stage",
            dir, s->zero_stage, zero_stage);
    if (s->zero_stage > 0 && zero_stage > 0 && made_layout && layout && made_layout != layout)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: made with ZeRO-%d, whose optimizer slices were cut otherwise than this run's "
            "zero%d cuts them (zero2 on the CPU cuts them per bucket of layers, [memory] "
            "reduce_bucket_size; zero1, and a CUDA zero2 with offload_optimizer, over the whole "
            "buffer): resume with the checkpoint's [memory] strategies and reduce_bucket_size",
            dir, s->zero_stage, zero_stage);
    s->zero_layout = layout;
    /* optimizer buffers, by name and size (ZeRO: this rank's slice's) */
    if (zero_stage > 0)
        snprintf(path, sizeof path, "%s/optimizer.rank-%d.safetensors", dir, rank);
    else
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if ((st = ctrl_checkpoint_load_optimizer(path, ops, opt)) != CTRL_OK)
        return ctrl_error_wrap(st, "%s: the optimizer state does not fit this optimizer", dir);
    return CTRL_OK;
}

ctrl_status ctrl_checkpoint_load_optimizer(const char *path, const ctrl_optimizer_ops *ops,
                                           ctrl_optimizer *opt) {
    ctrl_safetensors *sf;
    ctrl_status st = ctrl_safetensors_open(path, &sf);
    if (st != CTRL_OK) return st;
    const int n = ops->state_count ? ops->state_count(opt) : 0;
    if (ctrl_safetensors_count(sf) != n)
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s holds %d buffers, the optimizer has %d", path,
                            ctrl_safetensors_count(sf), n);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        const char *name;
        float *data;
        int64_t numel;
        char key[80];
        st = ops->state_get(opt, i, &name, &data, &numel);
        ctrl_checkpoint_state_key(key, sizeof key, i, st == CTRL_OK ? name : "");
        const ctrl_dtype dt = st == CTRL_OK ? ctrl_optimizer_state_dtype(ops, opt, i) : CTRL_F32;
        if (st == CTRL_OK)
            st = dt == CTRL_F32 ? ctrl_safetensors_read_f32(sf, key, data, numel)
                                : ctrl_safetensors_read_raw(sf, key, dt, data, numel);
    }
    if (st == CTRL_OK && has_state_sync(ops)) st = ops->state_sync(opt, 1); /* and onto its device */
    ctrl_safetensors_close(sf);
    return st;
}
