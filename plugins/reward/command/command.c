/* The `command` reward: scores come from a long-lived program of the user's (a Python script
 * wrapping a TRL reward function, say) started once with /bin/sh -c COMMAND. Each batch goes to its
 * stdin as one JSON line (reward_json.h: prompts, completions, completion_ids and the row's other
 * columns) and one JSON line comes back on its stdout: a list of one number or null per
 * completion. Its stderr is ctrl's. A reply later than `timeout` seconds, a malformed one or the
 * program's exit stops the run with an error naming the reward; at the end the program's stdin is
 * closed, then it is asked to stop (SIGTERM) and, failing that, killed -- with everything it started:
 * it runs in a process group of its own (so a terminal's Ctrl-C reaches ctrl, which saves and then
 * stops it). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/plugin_api.h>

#include "../reward_clock.h"
#include "../reward_json.h"

CTRL_PLUGIN_API_DEFINE;

extern char **environ;

struct ctrl_reward {
    char name[160]; /* "reward.NAME (command `...`)" for messages */
    double timeout; /* seconds per batch */
    pid_t pid;      /* 0 once reaped */
    pid_t group;    /* its process group (the shell's pid), what it started included; 0 when none */
    int to_child;   /* its stdin */
    int from_child; /* its stdout */
    char *buf;      /* what it wrote and was not consumed yet */
    size_t len, cap;
};

/* "exited with status N" / "was killed by signal N" once the program is gone (reaping it), else "". */
static const char *exit_note(ctrl_reward *r, char *note, size_t cap) {
    int status = 0;
    note[0] = '\0';
    if (r->pid > 0 && waitpid(r->pid, &status, WNOHANG) == r->pid) {
        r->pid = 0;
        if (WIFEXITED(status))
            snprintf(note, cap, ": the program exited with status %d", WEXITSTATUS(status));
        else if (WIFSIGNALED(status))
            snprintf(note, cap, ": the program was killed by signal %d", WTERMSIG(status));
    }
    return note;
}

static void stop_child(ctrl_reward *r) {
    if (r->to_child >= 0) close(r->to_child), r->to_child = -1;
    if (r->from_child >= 0) close(r->from_child), r->from_child = -1;
    /* it sees EOF on stdin and should leave; then SIGTERM, then SIGKILL, to its whole group */
    const int sig[] = {0, SIGTERM, SIGKILL};
    for (int k = 0; k < 3 && r->pid > 0; k++) {
        if (sig[k]) kill(-r->group, sig[k]);
        for (int i = 0; i < 40; i++) {
            int status;
            if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
                r->pid = 0;
                break;
            }
            struct timespec ms50 = {0, 50000000};
            nanosleep(&ms50, NULL);
        }
    }
    if (r->group > 0) kill(-r->group, SIGKILL); /* whatever it left behind (ESRCH when nothing) */
    r->group = 0;
}

/* Writes the whole text before the deadline; SIGPIPE (a program that is gone) is held back for
 * this write and turned into an error. */
static ctrl_status send_all(ctrl_reward *r, const char *text, size_t n, double deadline) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ctrl_status st = CTRL_OK;
    char note[96];
    for (size_t done = 0; done < n && st == CTRL_OK;) {
        struct pollfd p = {.fd = r->to_child, .events = POLLOUT};
        const double left = deadline - reward_now();
        const int ready = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: the program did not read its batch within %g s",
                                r->name, r->timeout);
            break;
        }
        const ssize_t w = write(r->to_child, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            const int e = errno;
            st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: cannot send it the batch: %s%s", r->name, strerror(e),
                                exit_note(r, note, sizeof note));
            if (e == EPIPE) {
                const struct timespec zero = {0, 0};
                sigtimedwait(&pipe_set, NULL, &zero); /* the SIGPIPE this write raised */
            }
            break;
        }
        done += (size_t)w;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return st;
}

/* Reads up to the next newline before the deadline; *line points into r->buf (NUL-terminated). */
static ctrl_status recv_line(ctrl_reward *r, double deadline, char **line) {
    char note[96];
    for (;;) {
        char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
        if (nl) {
            *nl = '\0';
            *line = r->buf;
            return CTRL_OK;
        }
        if (r->len + 4096 + 1 > r->cap) {
            if (r->cap >= ((size_t)256 << 20))
                return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: a reply line over 256 MiB", r->name);
            char *b = realloc(r->buf, r->cap ? r->cap * 2 : 65536);
            if (!b) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", r->name);
            r->buf = b, r->cap = r->cap ? r->cap * 2 : 65536;
        }
        struct pollfd p = {.fd = r->from_child, .events = POLLIN};
        const double left = deadline - reward_now();
        const int ready = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: no reply within its timeout of %g s", r->name,
                                  r->timeout);
        const ssize_t got = read(r->from_child, r->buf + r->len, r->cap - r->len - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            struct timespec ms = {0, 100000000}; /* let a program that is exiting finish, for its status */
            nanosleep(&ms, NULL);
            return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: its stdout closed before a reply%s", r->name,
                                  exit_note(r, note, sizeof note));
        }
        r->len += (size_t)got;
    }
}

static ctrl_status command_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                  ctrl_reward **out) {
    (void)host;
    ctrl_status st = CTRL_OK;
    const char *command = ctrl_option_string(cfg, section, "command", &st);
    const double timeout = ctrl_option_float(cfg, section, "timeout", &st);
    if (st != CTRL_OK) return st;
    if (!command || !*command) return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] command: empty", section);
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", section);
    snprintf(r->name, sizeof r->name, "%s (command `%.100s`)", section, command);
    r->timeout = timeout, r->to_child = r->from_child = -1;
    int in[2] = {-1, -1}, outp[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0)
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: cannot make pipes: %s", r->name, strerror(errno));
    if (st == CTRL_OK) {
        posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
        char *const argv[] = {"sh", "-c", (char *)command, NULL};
        /* in a process group of its own, so that stopping it reaches what the shell started too
         * (sh -c does not always exec: `sleep 30` or a wrapper script would outlive it) */
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attr, 0);
        const int e = posix_spawn(&r->pid, "/bin/sh", &fa, &attr, argv, environ);
        posix_spawnattr_destroy(&attr);
        if (e == 0) r->group = r->pid;
        if (e != 0) st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: cannot start it: %s", r->name, strerror(e));
    }
    posix_spawn_file_actions_destroy(&fa);
    if (in[0] >= 0) close(in[0]);
    if (outp[1] >= 0) close(outp[1]);
    r->to_child = in[1], r->from_child = outp[0];
    if (st != CTRL_OK) {
        stop_child(r);
        free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

static ctrl_status command_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    if (r->pid <= 0 || r->to_child < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: the program is no longer running", r->name);
    char *text = reward_json_batch(b);
    if (!text) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the batch", r->name);
    const size_t n = strlen(text);
    const double deadline = reward_now() + r->timeout;
    ctrl_status st = send_all(r, text, n, deadline);
    if (st == CTRL_OK) st = send_all(r, "\n", 1, deadline);
    free(text);
    char *line = NULL;
    if (st == CTRL_OK) st = recv_line(r, deadline, &line);
    if (st == CTRL_OK) {
        st = reward_json_scores(r->name, line, b->n, out);
        const size_t used = strlen(line) + 1; /* consume the line */
        memmove(r->buf, r->buf + used, r->len - used);
        r->len -= used;
    }
    if (st != CTRL_OK) stop_child(r); /* out of step with the program: it cannot be trusted further */
    return st;
}

static void command_destroy(ctrl_reward *r) {
    stop_child(r);
    free(r->buf);
    free(r);
}

static const ctrl_reward_ops command_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = command_create,
    .score = command_score,
    .destroy = command_destroy,
};

static const ctrl_option command_options[] = {
    {.key = "command",
     .type = CTRL_OPT_STRING,
     .flags = CTRL_OPT_REQUIRED,
     .doc =
         "The program, run once with /bin/sh -c in the current directory: it reads one JSON batch per "
         "line on stdin ({\"prompts\", \"completions\", \"completion_ids\", and the row's other columns}, "
         "each a list with one entry per completion) and answers each with one line on stdout, a JSON list "
         "of one number or null per completion (examples/rewards/trl_reward_command.py wraps a TRL reward "
         "function). Its stderr is ctrl's; nothing else may go to its stdout."},
    {.key = "timeout",
     .type = CTRL_OPT_FLOAT,
     .default_value = "300",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0.001,
     .doc = "Seconds a batch may take (sending it and the reply); later, the run stops with an error."},
    CTRL_OPTION_END,
};

static const ctrl_plugin command_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "command",
    .version = "0.1.0",
    .summary =
        "scores from a long-lived program of yours over JSON lines on stdin/stdout (Python reward functions)",
    .options = command_options,
    .init = ctrl_plugin_api_init,
    .ops = &command_ops,
};

CTRL_PLUGIN_DEFINE(&command_plugin)
