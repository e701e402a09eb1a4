/* The collectives' watchdog (see backend_mpi_watch.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "collective/backend_mpi_watch.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_t thread;
static int running, quit, my_rank, idle; /* idle: the thread waits for an arm, no deadline */
static double timeout_s = 1800;
static const char *armed;        /* the call waited in, or NULL */
static struct timespec deadline; /* CLOCK_MONOTONIC */
static unsigned long generation; /* one per arm: a deadline belongs to one call */
static struct timespec waiting;  /* the deadline the thread sleeps until (when not idle) */

static int before(struct timespec a, struct timespec b) {
    return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!quit) {
        if (!armed) {
            idle = 1;
            pthread_cond_wait(&cv, &mu);
            idle = 0;
            continue;
        }
        const unsigned long g = generation;
        const struct timespec until = deadline;
        waiting = until;
        int rc = 0;
        while (!quit && armed && generation == g && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&cv, &mu, &until);
        if (quit || !armed || generation != g) continue; /* done in time, or another call since */
        fprintf(stderr,
                "ctrl: error: rank %d: %s: the other ranks did not join within %.0f s ([train] ddp_timeout): "
                "a rank stopped, failed or is far behind; ending the job\n",
                my_rank, armed, timeout_s);
        fflush(stderr);
        _exit(1); /* MPI_Abort is not ours to call from this thread (MPI_THREAD_FUNNELED) */
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

int mpi_watch_start(int rank) {
    if (running) return 1;
    my_rank = rank, quit = 0, armed = NULL;
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return 0;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    const int ok = pthread_cond_init(&cv, &a) == 0;
    pthread_condattr_destroy(&a);
    running = ok && pthread_create(&thread, NULL, watch, NULL) == 0;
    return running;
}

void mpi_watch_set_timeout(double seconds) {
    pthread_mutex_lock(&mu);
    timeout_s = seconds;
    pthread_mutex_unlock(&mu);
}

void mpi_watch_arm(const char *call) {
    if (!running) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&mu);
    const double t = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 + timeout_s;
    deadline.tv_sec = (time_t)t;
    deadline.tv_nsec = (long)((t - (double)deadline.tv_sec) * 1e9);
    armed = call, generation++;
    /* a thread sleeping until an earlier deadline wakes then and waits on for this one */
    if (idle || before(deadline, waiting)) pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

void mpi_watch_disarm(void) {
    if (!running) return;
    pthread_mutex_lock(&mu); /* no signal: the thread finds it disarmed when it next wakes */
    armed = NULL;
    pthread_mutex_unlock(&mu);
}

void mpi_watch_stop(void) {
    if (!running) return;
    pthread_mutex_lock(&mu);
    quit = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    pthread_cond_destroy(&cv);
    running = 0;
}
