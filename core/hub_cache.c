/* Hub ids resolved in the local Hugging Face cache (hub_cache.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file_text.h"
#include "hub_cache.h"

static int name_char(int c) { return isalnum(c) || c == '-' || c == '_' || c == '.'; }

int ctrl_hub_looks_like_id(const char *s) {
    if (!s || !*s || *s == '.' || *s == '-') return 0;
    int slashes = 0, len = 0;
    for (const char *p = s; *p && *p != '@'; p++, len++) {
        if (*p == '/') {
            if (++slashes > 1 || p == s || !p[1] || p[1] == '/' || p[1] == '.' || p[1] == '@') return 0;
        } else if (!name_char((unsigned char)*p)) {
            return 0;
        }
    }
    const char *at = strchr(s, '@');
    /* a revision may hold '/' (refs/convert/parquet, refs/pr/1), never "..", "//" or an end '/' */
    const char *rev = at ? at + 1 : NULL;
    return len > 0 && len <= 200 &&
           (!rev || (rev[0] && rev[0] != '/' && rev[strlen(rev) - 1] != '/' && !strstr(rev, "..") &&
                     !strstr(rev, "//") && !strchr(rev, '\\')));
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The cache directory, as huggingface_hub's constants resolve it. */
static void cache_dir(char *out, size_t cap) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        snprintf(out, cap, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(out, cap, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        snprintf(out, cap, "%s/huggingface/hub", v);
    else
        snprintf(out, cap, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : "");
}

/* kind: "models" or "datasets", the cache's folder prefix for the repository type. */
static ctrl_status snapshot_of(const char *kind, const char *id, char *out, size_t cap) {
    if (!ctrl_hub_looks_like_id(id)) return ctrl_error_set(CTRL_ERR_IO, "%s: not a Hugging Face Hub id", id);
    char cache[2048], repo[3072], name[512], rev[256] = "main";
    cache_dir(cache, sizeof cache);
    const char *at = strchr(id, '@');
    const size_t n = at ? (size_t)(at - id) : strlen(id);
    if (at) snprintf(rev, sizeof rev, "%s", at + 1);
    size_t k = 0; /* ORG/NAME -> ORG--NAME */
    for (size_t i = 0; i < n && k + 2 < sizeof name; i++) {
        if (id[i] == '/')
            name[k++] = '-', name[k++] = '-';
        else
            name[k++] = id[i];
    }
    name[k] = '\0';
    snprintf(repo, sizeof repo, "%s/%s--%s", cache, kind, name);
    char ref[3400], snap[3600];
    snprintf(ref, sizeof ref, "%s/refs/%s", repo, rev);
    ctrl_status st;
    char *hash = ctrl_read_text_file(ref, 256, &st);
    if (hash) hash[strcspn(hash, " \t\r\n")] = '\0';
    snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, hash && *hash ? hash : rev); /* a hash as revision */
    free(hash);
    if (is_dir(snap)) {
        if (strlen(snap) >= cap) return ctrl_error_set(CTRL_ERR_IO, "%s: cache path too long", id);
        snprintf(out, cap, "%s", snap);
        return CTRL_OK;
    }
    return ctrl_error_set(
        CTRL_ERR_IO,
        "%s is not in the local Hugging Face cache (looked for %s, then %s/snapshots/%s; the cache "
        "is HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub); ctrl never downloads: "
        "`huggingface-cli download %s%.*s` on a machine with network puts it there",
        id, ref, repo, rev, strcmp(kind, "datasets") ? "" : "--repo-type dataset ", (int)n, id);
}

ctrl_status ctrl_hub_snapshot(const char *id, char *out, size_t cap) {
    return snapshot_of("models", id, out, cap);
}

ctrl_status ctrl_hub_dataset_snapshot(const char *id, char *out, size_t cap) {
    return snapshot_of("datasets", id, out, cap);
}

const char *ctrl_hub_resolve(const char *path, char *buf, size_t cap) {
    struct stat sb;
    if (!path || stat(path, &sb) == 0 || !ctrl_hub_looks_like_id(path)) return path;
    /* a miss is not an error here: the loader that then fails to read `path` says what was looked for */
    return ctrl_hub_snapshot(path, buf, cap) == CTRL_OK ? buf : path;
}
