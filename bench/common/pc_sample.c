/* A sampling profiler for machines without perf (the lent GPU machines' hosts): LD_PRELOAD this
 * library into a program and, where /proc/self/comm equals PC_SAMPLE_COMM (default "ctrl"), it
 * samples the interrupted instruction address every millisecond of the process's CPU time
 * (ITIMER_PROF, all threads) and writes one line per sample at exit to $PC_SAMPLE_OUT.<pid>:
 * the module's path and the address's offset in that file (from /proc/self/maps), for
 * bench/common/pc_report.py to resolve with
 * nm. Build: cc -O2 -shared -fPIC -o libpc_sample.so bench/common/pc_sample.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#define CAPACITY (1u << 22)

static void **samples;
static volatile size_t n_samples;

static void on_prof(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    const ucontext_t *uc = context;
    size_t i = __atomic_fetch_add(&n_samples, 1, __ATOMIC_RELAXED);
    if (i < CAPACITY) samples[i] = (void *)uc->uc_mcontext.gregs[REG_RIP];
}

static int wanted(void) {
    const char *want = getenv("PC_SAMPLE_COMM");
    char comm[64] = {0};
    FILE *f = fopen("/proc/self/comm", "r");
    if (!f || !fgets(comm, sizeof comm, f)) {
        if (f) fclose(f);
        return 0;
    }
    fclose(f);
    comm[strcspn(comm, "\n")] = 0;
    return getenv("PC_SAMPLE_OUT") && !strcmp(comm, want ? want : "ctrl");
}

__attribute__((constructor)) static void start(void) {
    if (!wanted() || !(samples = malloc(sizeof(void *) * CAPACITY))) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &every, NULL);
}

/* ITIMER_PROF survives execve, and a program that executes itself again (ctrl's OpenBLAS restart)
 * would take the next tick before this library's constructor set the handler: SIGPROF's default
 * action ends it. The timer is stopped first; the new image samples itself from its constructor. */
int execv(const char *path, char *const argv[]) {
    static const struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    int (*real)(const char *, char *const[]) =
        (int (*)(const char *, char *const[]))dlsym(RTLD_NEXT, "execv");
    return real ? real(path, argv) : -1;
}

/* Plugins unloaded before the report would leave their samples unresolved: while sampling, dlclose
 * keeps every library mapped (this definition comes first in the lookup order under LD_PRELOAD). */
int dlclose(void *handle) {
    (void)handle;
    return 0;
}

/* the mapping holding addr in /proc/self/maps: its path and addr's offset in the file */
static int locate(FILE *maps, unsigned long addr, char *path, size_t cap, unsigned long *offset) {
    char line[4096];
    rewind(maps);
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, off;
        char perms[8];
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %n", &lo, &hi, perms, &off, &name_at) < 4) continue;
        if (addr < lo || addr >= hi) continue;
        snprintf(path, cap, "%s", name_at ? line + name_at : "?");
        path[strcspn(path, "\n")] = 0;
        if (!path[0]) snprintf(path, cap, "?");
        *offset = addr - lo + off;
        return 1;
    }
    return 0;
}

__attribute__((destructor)) static void stop(void) {
    if (!samples) return;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    char path[4096], module[4096], cmd[4096] = {0};
    snprintf(path, sizeof path, "%s.%d", getenv("PC_SAMPLE_OUT"), (int)getpid());
    FILE *f = fopen(path, "w"), *maps = fopen("/proc/self/maps", "r"), *c = fopen("/proc/self/cmdline", "r");
    if (c) {
        size_t n = fread(cmd, 1, sizeof cmd - 1, c);
        for (size_t i = 0; i < n; i++)
            if (!cmd[i]) cmd[i] = ' ';
        fclose(c);
    }
    if (f && maps) {
        fprintf(f, "#cmd\t%s\n", cmd);
        size_t n = n_samples < CAPACITY ? n_samples : CAPACITY;
        for (size_t i = 0; i < n; i++) {
            unsigned long at;
            if (locate(maps, (unsigned long)samples[i], module, sizeof module, &at))
                fprintf(f, "%s\t%lx\n", module, at);
            else
                fprintf(f, "?\t%lx\n", (unsigned long)samples[i]);
        }
    }
    if (f) fclose(f);
    if (maps) fclose(maps);
}
