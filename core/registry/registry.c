/* The plugin registry: descriptors by (kind, name), loaded from shared objects with libltdl or
 * added from statically linked lists. Every problem is one message naming the file; loading
 * goes on with the other files. */
#include "registry/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ltdl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "registry/plugin_check.h"

typedef struct loaded_entry {
    ctrl_plugin_entry e;
    char *file;
} loaded_entry;

struct ctrl_registry {
    loaded_entry *entries;
    int n, cap;
    lt_dlhandle *handles;
    int n_handles, cap_handles;
    char **dirs_seen; /* real paths of directories already scanned */
    int n_dirs_seen;
};

static int ltdl_users;

ctrl_status ctrl_registry_create(ctrl_registry **out) {
    ctrl_registry *reg = calloc(1, sizeof *reg);
    if (!reg) return ctrl_error_set(CTRL_ERR_NOMEM, "plugin registry: out of memory");
    if (ltdl_users++ == 0 && lt_dlinit() != 0) {
        ltdl_users--;
        free(reg);
        return ctrl_error_set(CTRL_ERR_PLUGIN, "plugin registry: lt_dlinit failed: %s", lt_dlerror());
    }
    *out = reg;
    return CTRL_OK;
}

void ctrl_registry_destroy(ctrl_registry *reg) {
    if (!reg) return;
    for (int i = 0; i < reg->n; i++) free(reg->entries[i].file);
    free(reg->entries);
    for (int i = 0; i < reg->n_handles; i++) lt_dlclose(reg->handles[i]);
    free(reg->handles);
    for (int i = 0; i < reg->n_dirs_seen; i++) free(reg->dirs_seen[i]);
    free(reg->dirs_seen);
    free(reg);
    if (--ltdl_users == 0) lt_dlexit();
}

static int entry_cmp(const void *a, const void *b) {
    const ctrl_plugin *pa = ((const loaded_entry *)a)->e.plugin, *pb = ((const loaded_entry *)b)->e.plugin;
    if (pa->kind != pb->kind) return (int)pa->kind - (int)pb->kind;
    return strcmp(pa->name, pb->name);
}

const ctrl_plugin_entry *ctrl_registry_find(const ctrl_registry *reg, ctrl_kind kind, const char *name) {
    for (int i = 0; i < reg->n; i++) {
        const ctrl_plugin *p = reg->entries[i].e.plugin;
        if (p->kind == kind && !strcmp(p->name, name)) return &reg->entries[i].e;
    }
    return NULL;
}

ctrl_status ctrl_registry_require(const ctrl_registry *reg, ctrl_kind kind, const char *name,
                                  const ctrl_plugin **out) {
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, kind, name);
    if (!e)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s plugin '%s' is not loaded (see --plugin-dir)",
                              ctrl_kind_name(kind), name);
    *out = e->plugin;
    return CTRL_OK;
}

/* Checks every descriptor of a list and registers them all, or none. */
static ctrl_status add_list(ctrl_registry *reg, const ctrl_plugin *const *list, const char *origin) {
    if (!list) return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: ctrl_plugins() returned NULL", origin);
    int count = 0;
    for (; list[count]; count++) {
        if (count >= 1024)
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin list is not NULL-terminated", origin);
        ctrl_status st = ctrl_plugin_check(list[count], origin);
        if (st != CTRL_OK) return st;
        const ctrl_plugin *p = list[count];
        const ctrl_plugin_entry *dup = ctrl_registry_find(reg, p->kind, p->name);
        if (dup)
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: %s plugin '%s' is already loaded from %s", origin,
                                  ctrl_kind_name(p->kind), p->name, dup->file);
        for (int j = 0; j < count; j++)
            if (list[j]->kind == p->kind && !strcmp(list[j]->name, p->name))
                return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: %s plugin '%s' is listed twice", origin,
                                      ctrl_kind_name(p->kind), p->name);
    }
    if (count == 0) return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: ctrl_plugins() lists no plugin", origin);
    for (int i = 0; i < count; i++) {
        const ctrl_plugin *p = list[i];
        if (p->init) {
            ctrl_error_clear();
            ctrl_status st = p->init(ctrl_host_table());
            if (st != CTRL_OK) {
                if (!ctrl_error_message()[0]) ctrl_error_set(st, "%s", ctrl_status_name(st));
                return ctrl_error_wrap(CTRL_ERR_PLUGIN, "%s: %s plugin '%s' failed to initialise", origin,
                                       ctrl_kind_name(p->kind), p->name);
            }
        }
    }
    if (reg->n + count > reg->cap) {
        int cap = reg->cap ? reg->cap * 2 : 16;
        while (cap < reg->n + count) cap *= 2;
        loaded_entry *e = realloc(reg->entries, (size_t)cap * sizeof *e);
        if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "plugin registry: out of memory");
        reg->entries = e;
        reg->cap = cap;
    }
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < count && st == CTRL_OK; i++) {
        loaded_entry *le = &reg->entries[reg->n];
        if (!(le->file = strdup(origin))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "plugin registry: out of memory");
            break;
        }
        reg->n++;
        le->e.plugin = list[i];
        le->e.file = le->file;
    }
    qsort(reg->entries, (size_t)reg->n, sizeof *reg->entries, entry_cmp);
    return st;
}

ctrl_status ctrl_registry_add_list(ctrl_registry *reg, const ctrl_plugin *const *list, const char *origin) {
    return add_list(reg, list, origin);
}

static ctrl_status keep_handle(ctrl_registry *reg, lt_dlhandle h) {
    if (reg->n_handles == reg->cap_handles) {
        int cap = reg->cap_handles ? reg->cap_handles * 2 : 16;
        lt_dlhandle *hs = realloc(reg->handles, (size_t)cap * sizeof *hs);
        if (!hs) return ctrl_error_set(CTRL_ERR_NOMEM, "plugin registry: out of memory");
        reg->handles = hs;
        reg->cap_handles = cap;
    }
    reg->handles[reg->n_handles++] = h;
    return CTRL_OK;
}

ctrl_status ctrl_registry_load_file(ctrl_registry *reg, const char *path) {
    ctrl_status st = ctrl_plugin_check_file(path);
    if (st != CTRL_OK) return st;
    /* Local symbols, resolved now: a plugin with a missing dependency fails here, not mid-run. */
    lt_dladvise advise;
    lt_dladvise_init(&advise);
    lt_dladvise_local(&advise);
    lt_dlhandle h = lt_dlopenadvise(path, advise);
    lt_dladvise_destroy(&advise);
    if (!h) return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: cannot load: %s", path, lt_dlerror());
    ctrl_plugins_fn entry = (ctrl_plugins_fn)(uintptr_t)lt_dlsym(h, CTRL_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        lt_dlclose(h);
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "%s: not a ctrl plugin: no '%s' symbol (use CTRL_PLUGIN_DEFINE)", path,
                              CTRL_PLUGIN_ENTRY_SYMBOL);
    }
    st = add_list(reg, entry(), path);
    if (st != CTRL_OK) {
        lt_dlclose(h);
        return st;
    }
    return keep_handle(reg, h);
}

static int ends_with_so(const char *name) {
    size_t n = strlen(name);
    return n > 3 && !strcmp(name + n - 3, ".so");
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Remembers a directory's real path; returns 1 when it was scanned before. */
static int seen_dir(ctrl_registry *reg, const char *dir) {
    char *real = realpath(dir, NULL);
    if (!real) return 0;
    for (int i = 0; i < reg->n_dirs_seen; i++)
        if (!strcmp(reg->dirs_seen[i], real)) {
            free(real);
            return 1;
        }
    char **d = realloc(reg->dirs_seen, (size_t)(reg->n_dirs_seen + 1) * sizeof *d);
    if (!d) {
        free(real);
        return 0;
    }
    reg->dirs_seen = d;
    reg->dirs_seen[reg->n_dirs_seen++] = real;
    return 0;
}

ctrl_status ctrl_registry_load_dir(ctrl_registry *reg, const char *dir) {
    if (seen_dir(reg, dir)) return CTRL_OK;
    DIR *d = opendir(dir);
    if (!d) return ctrl_error_set(CTRL_ERR_PLUGIN, "plugin directory %s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!ends_with_so(de->d_name)) {
            if (de->d_name[0] != '.') CTRL_DEBUG("plugin directory %s: ignoring %s", dir, de->d_name);
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, name_cmp);
    ctrl_error_saved first = {.status = CTRL_OK};
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            CTRL_DEBUG("plugin directory %s: ignoring %s (not a regular file)", dir, names[i]);
            free(names[i]);
            continue;
        }
        ctrl_status st = ctrl_registry_load_file(reg, path);
        if (st != CTRL_OK) {
            CTRL_ERROR("%s", ctrl_error_message());
            if (first.status == CTRL_OK) ctrl_error_save(&first, st);
        } else {
            CTRL_DEBUG("loaded plugin file %s", path);
        }
        free(names[i]);
    }
    free(names);
    return ctrl_error_restore(&first);
}

ctrl_status ctrl_registry_load_standard(ctrl_registry *reg, const char *const *dirs, int n_dirs) {
    ctrl_error_saved first = {.status = CTRL_OK};
#define NOTE_FAILURE(st)                                                                                     \
    do {                                                                                                     \
        ctrl_status st_ = (st);                                                                              \
        if (st_ != CTRL_OK && first.status == CTRL_OK) ctrl_error_save(&first, st_);                         \
    } while (0)
    for (int i = 0; i < n_dirs; i++) {
        struct stat sb;
        if (stat(dirs[i], &sb) != 0) {
            NOTE_FAILURE(ctrl_error_set(CTRL_ERR_PLUGIN, "--plugin-dir %s: %s", dirs[i], strerror(errno)));
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            NOTE_FAILURE(ctrl_error_set(CTRL_ERR_PLUGIN, "--plugin-dir %s: not a directory", dirs[i]));
            continue;
        }
        NOTE_FAILURE(ctrl_registry_load_dir(reg, dirs[i]));
    }
    const char *env = getenv("CTRL_PLUGIN_PATH");
    if (env && env[0]) {
        char *copy = strdup(env), *save = NULL;
        if (!copy) NOTE_FAILURE(ctrl_error_set(CTRL_ERR_NOMEM, "CTRL_PLUGIN_PATH: out of memory"));
        for (char *tok = copy ? strtok_r(copy, ":", &save) : NULL; tok; tok = strtok_r(NULL, ":", &save)) {
            struct stat sb;
            if (stat(tok, &sb) == 0 && S_ISDIR(sb.st_mode))
                NOTE_FAILURE(ctrl_registry_load_dir(reg, tok));
            else
                CTRL_DEBUG("CTRL_PLUGIN_PATH: skipping %s (not a directory)", tok);
        }
        free(copy);
    }
    /* The install directory: beside the libctrl.so actually loaded (<libdir>/ctrl/plugins), so an
     * installed tree works wherever it was installed to; then the configured prefix's. */
    Dl_info info;
    if (dladdr((void *)(uintptr_t)ctrl_registry_load_standard, &info) && info.dli_fname) {
        char lib_dir[4096];
        snprintf(lib_dir, sizeof lib_dir, "%s", info.dli_fname);
        char *slash = strrchr(lib_dir, '/');
        if (slash) {
            *slash = '\0';
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/ctrl/plugins", lib_dir);
            struct stat sb;
            if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) NOTE_FAILURE(ctrl_registry_load_dir(reg, dir));
        }
    }
#ifdef CTRL_PLUGIN_INSTALL_DIR
    struct stat sb;
    if (stat(CTRL_PLUGIN_INSTALL_DIR, &sb) == 0 && S_ISDIR(sb.st_mode))
        NOTE_FAILURE(ctrl_registry_load_dir(reg, CTRL_PLUGIN_INSTALL_DIR));
#endif
#undef NOTE_FAILURE
    return ctrl_error_restore(&first);
}

int ctrl_registry_count(const ctrl_registry *reg) { return reg->n; }

const ctrl_plugin_entry *ctrl_registry_at(const ctrl_registry *reg, int i) {
    return (i >= 0 && i < reg->n) ? &reg->entries[i].e : NULL;
}

void ctrl_registry_names(const ctrl_registry *reg, ctrl_kind kind, char *buf, size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < reg->n; i++) {
        const ctrl_plugin *p = reg->entries[i].e.plugin;
        if (p->kind != kind) continue;
        int w = snprintf(buf + len, cap > len ? cap - len : 0, "%s%s", len ? ", " : "", p->name);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
    if (cap && !buf[0]) /* how plugins are found (ctrl_registry_load_standard) */
        snprintf(buf, cap,
                 "(none loaded: plugins are read from --plugin-dir DIR, the directories of CTRL_PLUGIN_PATH, "
                 "then %s)",
#ifdef CTRL_PLUGIN_INSTALL_DIR
                 CTRL_PLUGIN_INSTALL_DIR
#else
                 "the install directory"
#endif
        );
}
