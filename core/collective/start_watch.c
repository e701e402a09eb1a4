/* A watchdog over MPI_Init (see start_watch.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collective/start_watch.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running, done;
static double timeout_s;
static ctrl_collective_info who;
static char marks[4200]; /* the job's mark directory, or "" */

/* The launcher's id of this job (the same on every rank, another for the next job), or NULL. */
static const char *job_id(char *buf, size_t cap) {
    const char *ns = getenv("PMIX_NAMESPACE"), *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (ns && *ns) return snprintf(buf, cap, "%s", ns) < (int)cap ? buf : NULL;
    if (job && *job) return snprintf(buf, cap, "%s.%s", job, step ? step : "0") < (int)cap ? buf : NULL;
    return NULL;
}

/* The ranks without a mark, as "1, 3" (at most a few named), into buf; 0 when none is known. */
static int missing(char *buf, size_t cap) {
    int n = 0;
    size_t at = 0;
    buf[0] = '\0';
    for (int r = 0; marks[0] && r < who.size; r++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%d", marks, r);
        if (access(path, F_OK) == 0) continue;
        if (n++ < 8 && at < cap) at += (size_t)snprintf(buf + at, cap - at, "%s%d", n > 1 ? ", " : "", r);
    }
    if (n > 8 && at < cap) snprintf(buf + at, cap - at, " and %d more", n - 8);
    return n;
}

static void *watch(void *arg) {
    (void)arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (!done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &until);
    if (!done) {
        char list[256];
        const int n = missing(list, sizeof list);
        if (n)
            fprintf(stderr,
                    "ctrl: error: rank %d: the job's %d ranks did not all start within %.0f s ([train] "
                    "ddp_timeout): rank%s %s never reached MPI_Init (did not start, or stopped while "
                    "starting); ending the job\n",
                    who.rank, who.size, timeout_s, n > 1 ? "s" : "", list);
        else
            fprintf(stderr,
                    "ctrl: error: rank %d: the job's %d ranks did not all start within %.0f s ([train] "
                    "ddp_timeout): a rank did not start, or stopped while starting (which one is not known "
                    "here: the ranks leave a mark in a shared output_dir under an MPI or Slurm launcher); "
                    "ending the job\n",
                    who.rank, who.size, timeout_s);
        fflush(stderr);
        _exit(1);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

void start_watch_begin(const ctrl_collective_info *env, const char *dir, double seconds) {
    who = *env, timeout_s = seconds, done = 0, marks[0] = '\0';
    char id[256];
    if (dir && job_id(id, sizeof id) &&
        snprintf(marks, sizeof marks, "%s/.ctrl-start-%s", dir, id) < (int)sizeof marks) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%d", marks, who.rank);
        FILE *f = (mkdir(marks, 0777) == 0 || errno == EEXIST) ? fopen(path, "w") : NULL;
        if (f)
            fclose(f);
        else
            marks[0] = '\0';
    }
    running = pthread_create(&thread, NULL, watch, NULL) == 0;
}

void start_watch_done(int remove_marks) {
    if (running) {
        pthread_mutex_lock(&mu);
        done = 1;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(thread, NULL);
        running = 0;
    }
    if (!remove_marks || !marks[0] || who.rank != 0) return;
    for (int r = 0; r < who.size; r++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%d", marks, r);
        unlink(path);
    }
    rmdir(marks);
}
