/* NCCL for the weight-transfer engine, loaded at run time as vLLM's pynccl_wrapper does: nothing
 * in the build depends on NCCL, and a server that never joins a group never maps it. See
 * weight_transfer.h. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/weight_transfer.h"

static serve_nccl lib;
static const serve_nccl *loaded;
static char why[768];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *env = getenv("CTRL_NCCL_LIBRARY");
    const char *path = env && *env ? env : "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why,
                 "NCCL weight transfer: cannot load %s (%s); install NCCL (it comes with PyTorch's CUDA "
                 "wheels) or "
                 "name the library with CTRL_NCCL_LIBRARY",
                 path, dlerror());
        return;
    }
    static const char *const names[] = {"ncclGetVersion",        "ncclCommInitRank",   "ncclCommAbort",
                                        "ncclCommGetAsyncError", "ncclGetErrorString", "ncclBroadcast",
                                        "ncclAllReduce"};
    void *fns[sizeof names / sizeof names[0]];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(fns[i] = dlsym(h, names[i]))) {
            snprintf(why, sizeof why, "NCCL weight transfer: %s has no %s (NCCL 2.x needed)", path, names[i]);
            dlclose(h);
            return;
        }
    /* dlsym's void * to function pointers, through memcpy (ISO C has no such cast) */
    memcpy(&lib.get_version, &fns[0], sizeof fns[0]);
    memcpy(&lib.comm_init_rank, &fns[1], sizeof fns[1]);
    memcpy(&lib.comm_abort, &fns[2], sizeof fns[2]);
    memcpy(&lib.comm_get_async_error, &fns[3], sizeof fns[3]);
    memcpy(&lib.get_error_string, &fns[4], sizeof fns[4]);
    memcpy(&lib.broadcast, &fns[5], sizeof fns[5]);
    memcpy(&lib.all_reduce, &fns[6], sizeof fns[6]);
    void *last = dlsym(h, "ncclGetLastError"); /* optional: the detail of an error */
    memcpy(&lib.get_last_error, &last, sizeof last);
    snprintf(lib.path, sizeof lib.path, "%s", path);
    loaded = &lib;
}

const serve_nccl *serve_nccl_load(void) {
    pthread_once(&once, load);
    if (!loaded) ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s", why);
    return loaded;
}
