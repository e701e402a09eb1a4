/* Dataset paths to data files (dataset_files.h). The split rules follow the `datasets` library's
 * defaults: the Hub's sharded names data/SPLIT-NNNNN-of-NNNNN.* first; else a split keyword as a
 * folder name or inside a file name (train|training, validation|valid|dev|val,
 * test|testing|eval|evaluation, bounded by one of "-._ 0-9" or a path separator); else every file
 * is the train split. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset/dataset_files.h"
#include "hub_cache.h"

#define MAX_FILES 100000
#define MAX_DEPTH 8

static const char *const keywords[][5] = {
    {"train", "train", "training", NULL},
    {"validation", "validation", "valid", "dev", "val"},
    {"test", "test", "testing", "eval", "evaluation"},
};

static int is_sep(int c) { return c == '-' || c == '.' || c == '_' || c == ' ' || isdigit(c); }

/* 1 when the keyword occurs in s[0..n) bounded by the start or a separator before, and by the end,
 * a '/' or a separator after; `file` asks for the file-name rule (a separator must follow). */
static int has_keyword(const char *s, size_t n, const char *kw, int file) {
    const size_t k = strlen(kw);
    for (size_t i = 0; i + k <= n; i++) {
        if (strncmp(s + i, kw, k) != 0) continue;
        if (i > 0 && !is_sep((unsigned char)s[i - 1])) continue;
        const char after = i + k < n ? s[i + k] : '\0';
        if (file ? is_sep((unsigned char)after) : (after == '\0' || is_sep((unsigned char)after))) return 1;
    }
    return 0;
}

/* data/SPLIT-NNNNN-of-NNNNN.* -> SPLIT */
static int sharded_split(const char *rel, char *buf, unsigned cap) {
    if (strncmp(rel, "data/", 5) != 0 || strchr(rel + 5, '/')) return 0;
    const char *name = rel + 5, *dash = strstr(name, "-of-");
    if (!dash || dash - name < 7) return 0;
    const char *digits = dash - 5;
    for (int i = 0; i < 5; i++)
        if (!isdigit((unsigned char)digits[i]) || !isdigit((unsigned char)dash[4 + i])) return 0;
    if (digits[-1] != '-' || (size_t)(digits - 1 - name) + 1 > cap || digits - 1 == name) return 0;
    snprintf(buf, cap, "%.*s", (int)(digits - 1 - name), name);
    return 1;
}

/* The canonical split of a path by the keyword rules: folder names first, then the file name. */
static const char *keyword_split(const char *rel, int dirs) {
    const char *base = strrchr(rel, '/');
    for (size_t s = 0; s < sizeof keywords / sizeof keywords[0]; s++)
        for (int k = 1; k < 5 && keywords[s][k]; k++) {
            if (dirs) { /* each folder component */
                for (const char *c = rel; base && c < base;) {
                    const char *e = strchr(c, '/');
                    if (has_keyword(c, (size_t)(e - c), keywords[s][k], 0)) return keywords[s][0];
                    c = e + 1;
                }
            } else {
                const char *b = base ? base + 1 : rel;
                if (has_keyword(b, strlen(b), keywords[s][k], 1)) return keywords[s][0];
            }
        }
    return NULL;
}

const char *ctrl_data_file_split(const char *rel, char *buf, unsigned cap) {
    if (sharded_split(rel, buf, cap)) return buf;
    const char *s = keyword_split(rel, 1);
    return s ? s : keyword_split(rel, 0);
}

typedef struct walk {
    char **rel;
    int n, cap;
    const char *why;
} walk;

static int data_ext(const char *name) {
    static const char *const meta[] = {"dataset_info.json", "dataset_infos.json", "state.json",
                                       "dataset_dict.json", NULL};
    for (int i = 0; meta[i]; i++)
        if (!strcmp(name, meta[i])) return 0;
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    return !strcmp(dot, ".parquet")                          ? 3
           : !strcmp(dot, ".jsonl") || !strcmp(dot, ".json") ? 2
           : !strcmp(dot, ".arrow")                          ? 1
                                                             : 0;
}

static void walk_dir(walk *w, const char *root, const char *rel, int depth) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while (!w->why && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ., .., .cache, .gitattributes, hidden folders */
        char sub[4096], full[8192];
        if ((size_t)snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >= sizeof sub)
            continue;
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat sb;
        if (stat(full, &sb) != 0) continue; /* a Hub snapshot's links into blobs/ are followed */
        if (S_ISDIR(sb.st_mode)) {
            if (depth < MAX_DEPTH) walk_dir(w, root, sub, depth + 1);
            continue;
        }
        if (!S_ISREG(sb.st_mode) || !data_ext(e->d_name)) continue;
        if (w->n == MAX_FILES) {
            w->why = "more than 100000 data files";
            break;
        }
        if (w->n == w->cap) {
            const int cap = w->cap ? 2 * w->cap : 64;
            char **r = realloc(w->rel, (size_t)cap * sizeof *r);
            if (!r) {
                w->why = "out of memory";
                break;
            }
            w->rel = r, w->cap = cap;
        }
        if (!(w->rel[w->n] = strdup(sub)))
            w->why = "out of memory";
        else
            w->n++;
    }
    closedir(d);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void ctrl_data_files_free(ctrl_data_files *f) {
    for (int i = 0; f->paths && i < f->n; i++) free(f->paths[i]);
    free(f->paths);
    f->paths = NULL, f->n = 0;
}

static ctrl_status add_path(ctrl_data_files *out, const char *root, const char *rel) {
    char **p = realloc(out->paths, (size_t)(out->n + 1) * sizeof *p);
    if (!p) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    out->paths = p;
    const size_t n = strlen(root) + strlen(rel) + 2;
    if (!(p[out->n] = malloc(n))) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    snprintf(p[out->n++], n, "%s%s%s", root, *rel && *root ? "/" : "", rel);
    return CTRL_OK;
}

/* The split of rel under the rule the folder uses (0 sharded, 1 folders, 2 file names, 3 none). */
static const char *split_by(int rule, const char *rel, char *buf, unsigned cap) {
    if (rule == 0) return sharded_split(rel, buf, cap) ? buf : NULL;
    if (rule == 3) return "train";
    return keyword_split(rel, rule == 1);
}

/* A split named by one of its keywords ("dev", "eval") means the canonical split. */
static const char *canonical(const char *split) {
    for (size_t s = 0; s < sizeof keywords / sizeof keywords[0]; s++)
        for (int k = 1; k < 5 && keywords[s][k]; k++)
            if (!strcmp(split, keywords[s][k])) return keywords[s][0];
    return split;
}

/* 1 when rel lies in the subset's folder (the `default` subset's is also `data/`, where push_to_hub
 * puts it). */
static int in_subset(const char *rel, const char *subset) {
    const size_t n = strlen(subset);
    if (!strncmp(rel, subset, n) && rel[n] == '/') return 1;
    return !strcmp(subset, "default") && !strncmp(rel, "data/", 5);
}

/* Keeps only the files of the subset; an error lists the top-level folders when none is. */
static ctrl_status keep_subset(walk *w, const char *subset, const char *shown) {
    int kept = 0;
    char folders[512] = "";
    for (int i = 0; i < w->n; i++) {
        if (in_subset(w->rel[i], subset)) {
            w->rel[kept++] = w->rel[i];
            continue;
        }
        const char *slash = strchr(w->rel[i], '/');
        char top[128];
        snprintf(top, sizeof top, "%.*s", slash ? (int)(slash - w->rel[i]) : 0, w->rel[i]);
        if (slash && !strstr(folders, top) && strlen(folders) + strlen(top) + 3 < sizeof folders)
            strcat(strcat(folders, *folders ? ", " : ""), top);
        free(w->rel[i]);
    }
    w->n = kept;
    if (kept) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_IO,
                          "%s: no data files in the folder of subset '%s' (folders: %s); set [data] subset",
                          shown, subset, *folders ? folders : "none");
}

static ctrl_status folder_files(const char *root, const char *shown, const char *subset, const char *split,
                                ctrl_data_files *out) {
    walk w = {0};
    walk_dir(&w, root, "", 0);
    ctrl_status st = CTRL_OK;
    if (w.why) st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", shown, w.why);
    if (st == CTRL_OK && w.n > 1) qsort(w.rel, (size_t)w.n, sizeof *w.rel, cmp_str);
    if (st == CTRL_OK && subset && *subset) st = keep_subset(&w, subset, shown);
    int best = 0; /* parquet over JSON lines over Arrow (save_to_disk): one folder, one format */
    for (int i = 0; i < w.n; i++) {
        const char *b = strrchr(w.rel[i], '/');
        const int e = data_ext(b ? b + 1 : w.rel[i]);
        best = e > best ? e : best;
    }
    if (st == CTRL_OK && best == 0)
        st = ctrl_error_set(CTRL_ERR_IO,
                            "%s: no data files in the folder (looked for .parquet, .jsonl, .json, .arrow)",
                            shown);
    int rule = 3;
    char buf[256], found[512] = "";
    for (int r = 0; st == CTRL_OK && r < 3 && rule == 3; r++)
        for (int i = 0; i < w.n && rule == 3; i++) {
            const char *b = strrchr(w.rel[i], '/');
            if (data_ext(b ? b + 1 : w.rel[i]) == best && split_by(r, w.rel[i], buf, sizeof buf)) rule = r;
        }
    for (int i = 0; st == CTRL_OK && i < w.n; i++) {
        const char *b = strrchr(w.rel[i], '/');
        if (data_ext(b ? b + 1 : w.rel[i]) != best) continue;
        const char *s = split_by(rule, w.rel[i], buf, sizeof buf);
        if (!s) continue;
        if (!strcmp(s, rule == 0 ? split : canonical(split))) {
            st = add_path(out, root, w.rel[i]);
        } else if (!strstr(found, s) && strlen(found) + strlen(s) + 3 < sizeof found) {
            strcat(found, *found ? ", " : "");
            strcat(found, s);
        }
    }
    if (st == CTRL_OK && out->n == 0)
        st = ctrl_error_set(
            CTRL_ERR_IO, "%s: no data files of split '%s' (splits found: %s); set [data] split or eval_split",
            shown, split, *found ? found : "none");
    for (int i = 0; i < w.n; i++) free(w.rel[i]);
    free(w.rel);
    return st;
}

ctrl_status ctrl_data_files_find(const char *path, const char *split, ctrl_data_files *out) {
    return ctrl_data_files_find_in(path, NULL, split, out);
}

ctrl_status ctrl_data_files_find_in(const char *path, const char *subset, const char *split,
                                    ctrl_data_files *out) {
    out->paths = NULL, out->n = 0;
    if (!split || !*split) split = "train";
    struct stat sb;
    ctrl_status st;
    if (stat(path, &sb) == 0) {
        st = S_ISDIR(sb.st_mode) ? folder_files(path, path, subset, split, out) : add_path(out, "", path);
    } else if (ctrl_hub_looks_like_id(path)) {
        char snap[4096], shown[4400];
        if ((st = ctrl_hub_dataset_snapshot(path, snap, sizeof snap)) != CTRL_OK)
            return ctrl_error_wrap(st, "%s: no such file or folder, and as a Hub dataset id", path);
        snprintf(shown, sizeof shown, "%s (the Hub dataset, cached at %s)", path, snap);
        st = folder_files(snap, shown, subset, split, out);
    } else {
        return ctrl_error_set(CTRL_ERR_IO, "%s: no such file or folder", path);
    }
    if (st != CTRL_OK) ctrl_data_files_free(out);
    return st;
}
