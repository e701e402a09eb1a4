/* The `http` reward: scores from a server of the user's (a Python one serving a TRL reward
 * function, say: examples/rewards/trl_reward_http.py). Each batch is POSTed to `url` as one JSON
 * object -- the `command` reward's (reward_json.h: prompts, completions, completion_ids and the
 * row's other columns) -- and the 200 reply's body is a JSON list of one number or null per
 * completion (or {"rewards": [...]}). One connection per batch (HTTP/1.1, Connection: close), the
 * reply read by Content-Length, chunked transfer coding or to the close. `timeout` bounds each
 * attempt, from connecting to the last byte; a refused or dropped connection and a 502, 503 or
 * 504 are tried again up to `retries` times (0.5 s, 1 s, 2 s, ... apart); any other status, a
 * malformed reply, a wrong count or a non-finite number stops the run with an error naming the
 * reward and the URL. http:// only: put a TLS endpoint behind a local proxy. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/plugin_api.h>

#include "../reward_clock.h"
#include "../reward_json.h"

CTRL_PLUGIN_API_DEFINE;

#define MAX_REPLY ((size_t)256 << 20)

struct ctrl_reward {
    char name[600]; /* "reward.NAME (http URL)" for messages */
    char host[256], port[16], target[2048], host_header[300];
    char *bearer; /* Authorization: Bearer, from the environment variable bearer_token_env */
    double timeout;
    int retries;
};

/* http://HOST[:PORT][/PATH[?QUERY]], HOST a name, an IPv4 address or [IPv6]. */
static ctrl_status parse_url(ctrl_reward *r, const char *section, const char *url) {
    if (!strncasecmp(url, "https://", 8))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[%s] url = %s: https is not supported (serve the reward over http on "
                              "localhost, or through a local TLS-terminating proxy)",
                              section, url);
    if (strncasecmp(url, "http://", 7) != 0)
        return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] url = %s: expected http://HOST[:PORT][/PATH]", section,
                              url);
    const char *h = url + 7, *end = h + strcspn(h, "/?#"), *hp_end = end;
    const char *colon = NULL;
    if (*h == '[') { /* [v6]:port */
        const char *close = memchr(h, ']', (size_t)(end - h));
        if (!close)
            return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] url = %s: unclosed [ in the host", section, url);
        snprintf(r->host, sizeof r->host, "%.*s", (int)(close - h - 1), h + 1);
        colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
        const size_t hl = (size_t)((colon ? colon : end) - h);
        snprintf(r->host, sizeof r->host, "%.*s", hl < sizeof r->host ? (int)hl : 0, h);
    }
    if (!r->host[0]) return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] url = %s: no host", section, url);
    const size_t pl = colon ? (size_t)(hp_end - colon - 1) : 0;
    if (colon && (pl == 0 || pl > 5 || strspn(colon + 1, "0123456789") < pl || atoi(colon + 1) < 1 ||
                  atoi(colon + 1) > 65535))
        return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] url = %s: the port must be 1..65535", section, url);
    snprintf(r->port, sizeof r->port, "%.*s", colon ? (int)pl : 2, colon ? colon + 1 : "80");
    snprintf(r->host_header, sizeof r->host_header, "%.*s", (int)(hp_end - h), h);
    const char *path = *end == '#' ? "/" : end;
    if (strlen(path) >= sizeof r->target - 2)
        return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] url = %s: the path is too long", section, url);
    snprintf(r->target, sizeof r->target, "%s%.*s", *path == '/' ? "" : "/", (int)strcspn(path, "#"), path);
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "[%s] url = %s: spaces and control characters are not allowed", section,
                                  url);
    return CTRL_OK;
}

/* Waits for `events` on fd until the deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        const double left = deadline - reward_now();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        const int k = poll(&p, 1, (int)(left * 1000) + 1);
        if (k < 0 && errno == EINTR) continue;
        return k > 0;
    }
}

/* Outcomes of one attempt: done (a reply, any status), retry (nothing was answered: connection
 * refused, reset or closed before a status line), fail (an error set). */
enum { ATTEMPT_DONE, ATTEMPT_RETRY, ATTEMPT_FAIL };

static int connect_to(ctrl_reward *r, double deadline, int *fd_out, char *why, size_t cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    const int rc = getaddrinfo(r->host, r->port, &hints, &ai);
    if (rc != 0) {
        ctrl_error_set(CTRL_ERR_RUNTIME, "%s: cannot resolve %s: %s", r->name, r->host, gai_strerror(rc));
        return ATTEMPT_FAIL;
    }
    int fd = -1, timed_out = 0;
    snprintf(why, cap, "no address");
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int err = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            socklen_t len = sizeof err;
            if (!wait_fd(fd, POLLOUT, deadline))
                err = ETIMEDOUT, timed_out = 1;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
        if (err) {
            snprintf(why, cap, "%s", strerror(err));
            close(fd), fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0 && timed_out) {
        ctrl_error_set(CTRL_ERR_RUNTIME, "%s: cannot connect within its timeout of %g s", r->name,
                       r->timeout);
        return ATTEMPT_FAIL;
    }
    *fd_out = fd;
    return fd < 0 ? ATTEMPT_RETRY : ATTEMPT_DONE;
}

static int send_all(ctrl_reward *r, int fd, const char *p, size_t n, double deadline, char *why, size_t cap) {
    while (n > 0) {
        if (!wait_fd(fd, POLLOUT, deadline)) {
            ctrl_error_set(CTRL_ERR_RUNTIME,
                           "%s: the server did not take the batch within its timeout of %g s", r->name,
                           r->timeout);
            return ATTEMPT_FAIL;
        }
        const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) {
            snprintf(why, cap, "sending the batch: %s", k < 0 ? strerror(errno) : "connection closed");
            return ATTEMPT_RETRY;
        }
        p += k, n -= (size_t)k;
    }
    return ATTEMPT_DONE;
}

/* The body of a chunked reply decoded in place; 0 when malformed. */
static int dechunk(char *body, size_t len, size_t *out_len) {
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        const unsigned long size = strtoul(body + in, &end, 16);
        char *crlf = strstr(body + in, "\r\n");
        if (end == body + in || !crlf || size > len) return 0;
        in = (size_t)(crlf + 2 - body);
        if (size == 0) break;
        if (in + size + 2 > len) return 0;
        memmove(body + out, body + in, size);
        out += size, in += size + 2;
    }
    body[out] = '\0';
    *out_len = out;
    return 1;
}

/* One POST of `body`: the status in *status and the reply body (malloc'd) in *reply. */
static int attempt(ctrl_reward *r, const char *body, size_t len, int *status, char **reply, char *why,
                   size_t cap) {
    const double deadline = reward_now() + r->timeout;
    int fd = -1;
    int res = connect_to(r, deadline, &fd, why, cap);
    if (res != ATTEMPT_DONE) return res;
    char head[3000];
    const int hn = snprintf(head, sizeof head,
                            "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: "
                            "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n",
                            r->target, r->host_header, len, r->bearer ? "Authorization: Bearer " : "",
                            r->bearer ? r->bearer : "", r->bearer ? "\r\n" : "");
    res = send_all(r, fd, head, (size_t)hn, deadline, why, cap);
    if (res == ATTEMPT_DONE) res = send_all(r, fd, body, len, deadline, why, cap);
    size_t n = 0, capb = 1 << 16;
    char *buf = res == ATTEMPT_DONE ? malloc(capb + 1) : NULL;
    if (res == ATTEMPT_DONE && !buf)
        res = ATTEMPT_FAIL, ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", r->name);
    size_t head_end = 0, want = 0; /* once the headers are in: where the body starts, its length */
    int chunked = 0;
    while (res == ATTEMPT_DONE) {
        if (n == capb) {
            char *b = capb < MAX_REPLY ? realloc(buf, 2 * capb + 1) : NULL;
            if (!b) {
                ctrl_error_set(CTRL_ERR_RUNTIME, "%s: a reply over %zu MiB", r->name, MAX_REPLY >> 20);
                res = ATTEMPT_FAIL;
                break;
            }
            buf = b, capb *= 2;
        }
        if (!wait_fd(fd, POLLIN, deadline)) {
            ctrl_error_set(CTRL_ERR_RUNTIME, "%s: no reply within its timeout of %g s", r->name, r->timeout);
            res = ATTEMPT_FAIL;
            break;
        }
        const ssize_t k = recv(fd, buf + n, capb - n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0 && n == 0) { /* reset before anything came back: nothing was answered */
            snprintf(why, cap, "waiting for the reply: %s", strerror(errno));
            res = ATTEMPT_RETRY;
        }
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = '\0';
        if (!head_end) { /* the headers: a Content-Length or chunked reply ends before the close */
            const char *sep = strstr(buf, "\r\n\r\n");
            if (!sep) continue;
            head_end = (size_t)(sep + 4 - buf);
            const char *cl = strcasestr(buf, "\r\ncontent-length:");
            const char *te = strcasestr(buf, "\r\ntransfer-encoding: chunked");
            chunked = te && te < sep;
            want = cl && cl < sep && !chunked ? (size_t)strtoull(cl + 17, NULL, 10) : (size_t)-1;
        }
        if (want != (size_t)-1 && n >= head_end + want) break;
        if (chunked && n >= head_end + 5 && !memcmp(buf + n - 5, "0\r\n\r\n", 5)) break;
    }
    close(fd);
    if (res != ATTEMPT_DONE) {
        free(buf);
        return res;
    }
    buf[n] = '\0';
    if (n == 0) {
        free(buf);
        snprintf(why, cap, "the server closed the connection without a reply");
        return ATTEMPT_RETRY;
    }
    if (!head_end || sscanf(buf, "HTTP/1.%*d %d", status) != 1) {
        ctrl_error_set(CTRL_ERR_RUNTIME, "%s: not an HTTP reply: %.120s", r->name, buf);
        free(buf);
        return ATTEMPT_FAIL;
    }
    size_t blen = n - head_end;
    if (want != (size_t)-1 && blen > want) blen = want;
    memmove(buf, buf + head_end, blen);
    buf[blen] = '\0';
    if (chunked && !dechunk(buf, blen, &blen)) {
        ctrl_error_set(CTRL_ERR_RUNTIME, "%s: a malformed chunked reply", r->name);
        free(buf);
        return ATTEMPT_FAIL;
    }
    *reply = buf;
    return ATTEMPT_DONE;
}

static ctrl_status http_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                               ctrl_reward **out) {
    (void)host;
    ctrl_status st = CTRL_OK;
    const char *url = ctrl_option_string(cfg, section, "url", &st);
    const double timeout = ctrl_option_float(cfg, section, "timeout", &st);
    const int retries = (int)ctrl_option_int(cfg, section, "retries", &st);
    const char *env = ctrl_config_get_string(cfg, section, "bearer_token_env");
    if (st != CTRL_OK) return st;
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", section);
    snprintf(r->name, sizeof r->name, "%s (http %.500s)", section, url ? url : "");
    r->timeout = timeout, r->retries = retries;
    st = parse_url(r, section, url ? url : "");
    if (st == CTRL_OK && env && *env) {
        const char *token = getenv(env);
        if (!token || !*token)
            st = ctrl_error_set(CTRL_ERR_CONFIG,
                                "[%s] bearer_token_env = %s: the environment variable is not set", section,
                                env);
        else if (strpbrk(token, "\r\n") || !(r->bearer = strdup(token)))
            st = ctrl_error_set(CTRL_ERR_CONFIG, "[%s] bearer_token_env = %s: not a usable token", section,
                                env);
    }
    if (st != CTRL_OK) {
        free(r->bearer);
        free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

/* The reply's scores: reward_json_scores' list, or the list under "rewards". */
static ctrl_status read_scores(ctrl_reward *r, const char *reply, int n, float *out) {
    cJSON *o = cJSON_Parse(reply);
    const cJSON *list = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "rewards") : NULL;
    char *text = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(o);
    ctrl_status st = reward_json_scores(r->name, text ? text : reply, n, out);
    free(text);
    return st;
}

static ctrl_status http_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    char *body = reward_json_batch(b);
    if (!body) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the batch", r->name);
    const size_t len = strlen(body);
    ctrl_status st = CTRL_OK;
    char why[256] = "";
    double pause = 0.5;
    for (int k = 0;; k++) {
        int status = 0;
        char *reply = NULL;
        const int res = attempt(r, body, len, &status, &reply, why, sizeof why);
        if (res == ATTEMPT_FAIL) {
            st = CTRL_ERR_RUNTIME;
            break;
        }
        const int transient = res == ATTEMPT_RETRY || status == 502 || status == 503 || status == 504;
        if (transient && k < r->retries) {
            if (res == ATTEMPT_DONE) snprintf(why, sizeof why, "HTTP %d", status);
            free(reply);
            struct timespec ts = {(time_t)pause, (long)((pause - (time_t)pause) * 1e9)};
            nanosleep(&ts, NULL);
            pause *= 2;
            continue;
        }
        if (res == ATTEMPT_RETRY) {
            st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: no answer (%s)%s", r->name, why,
                                r->retries ? ", after every retry" : "");
        } else if (status != 200) {
            st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s: HTTP %d: %.200s", r->name, status, reply);
        } else {
            st = read_scores(r, reply, b->n, out);
        }
        free(reply);
        break;
    }
    free(body);
    return st;
}

static void http_destroy(ctrl_reward *r) {
    free(r->bearer);
    free(r);
}

static const ctrl_reward_ops http_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = http_create,
    .score = http_score,
    .destroy = http_destroy,
};

static const ctrl_option http_options[] = {
    {.key = "url",
     .type = CTRL_OPT_STRING,
     .flags = CTRL_OPT_REQUIRED,
     .doc =
         "http://HOST[:PORT][/PATH]: each batch is POSTed there as one JSON object, the `command` reward's "
         "({\"prompts\", \"completions\", \"completion_ids\", and the row's other columns}, each a list with "
         "one entry per completion); the 200 reply is a JSON list of one number or null per completion, or "
         "{\"rewards\": [...]} (examples/rewards/trl_reward_http.py serves a TRL reward function)."},
    {.key = "timeout",
     .type = CTRL_OPT_FLOAT,
     .default_value = "300",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0.001,
     .doc = "Seconds one request may take, from connecting to the last byte of the reply; later, the run "
            "stops with an error."},
    {.key = "retries",
     .type = CTRL_OPT_INT,
     .default_value = "2",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX,
     .min = 0,
     .max = 10,
     .doc =
         "Further tries of a batch nobody answered (connection refused, reset or closed before a reply) or "
         "answered 502, 503 or 504, 0.5 s, 1 s, 2 s, ... apart; any other failure stops the run at once."},
    {.key = "bearer_token_env",
     .type = CTRL_OPT_STRING,
     .doc = "The name of an environment variable whose value is sent as `Authorization: Bearer ...` (unset: "
            "no Authorization header)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin http_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "http",
    .version = "0.1.0",
    .summary =
        "scores from an HTTP server of yours: each batch POSTed as JSON, one number per completion back",
    .options = http_options,
    .init = ctrl_plugin_api_init,
    .ops = &http_ops,
};

CTRL_PLUGIN_DEFINE(&http_plugin)
