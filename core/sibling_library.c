/* Loading libctrl's optional libraries (see sibling_library.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sibling_library.h"

const void *ctrl_sibling_library_table(const char *name, const char *override_env, const char *table_fn,
                                       int global, char *why, size_t cap) {
    const int flags = RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL);
    Dl_info self;
    char path[4200];
    void *h = NULL;
    const char *forced = override_env ? getenv(override_env) : NULL;
    if (forced && *forced) {
        if (!(h = dlopen(forced, flags))) {
            snprintf(why, cap, "%s=%s: %s", override_env, forced, dlerror());
            return NULL;
        }
    } else if (dladdr((void *)ctrl_sibling_library_table, &self) && self.dli_fname) {
        const char *slash = strrchr(self.dli_fname, '/');
        const int n = slash ? (int)(slash - self.dli_fname) : 0;
        snprintf(path, sizeof path, "%.*s/%s", n, self.dli_fname, name);
        h = dlopen(path, flags);
    }
    if (!h) h = dlopen(name, flags);
    if (!h) {
        snprintf(why, cap, "cannot load %s: %s", name, dlerror());
        return NULL;
    }
    const void *(*table)(void) = (const void *(*)(void))dlsym(h, table_fn);
    if (!table) {
        snprintf(why, cap, "%s has no %s: %s", name, table_fn, dlerror());
        return NULL;
    }
    return table();
}
