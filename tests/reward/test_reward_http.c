/* The `http` reward plugin, loaded from its .so through the registry, against a tiny HTTP server
 * run by the test in a thread: TRL's reward_len on the fixture TRL wrote
 * (tests/reference/make_reward_fixtures.py) over HTTP, the row's columns and completion ids in the
 * batch, {"rewards": [...]} and chunked replies, a bearer token from the environment, retries of a
 * dropped connection and a 503; and every misbehaviour -- a refused connection, a non-200 status,
 * a reply that is not JSON, a wrong count, NaN or an infinity, a server slower than the timeout,
 * a bad url -- an error naming the reward and the URL. */
#include <arpa/inet.h>
#include <cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "reward_case.h"

static int port, flaky_calls;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static long code_points(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* TRL's reward_len (-|20 - length|) of each completion, as a JSON list. */
static char *len_scores(const char *body) {
    cJSON *b = cJSON_Parse(body), *out = cJSON_CreateArray();
    const cJSON *c = cJSON_GetObjectItem(b, "completions");
    for (int i = 0; i < cJSON_GetArraySize(c); i++)
        cJSON_AddItemToArray(
            out, cJSON_CreateNumber(-labs(20 - code_points(cJSON_GetArrayItem(c, i)->valuestring))));
    char *text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out), cJSON_Delete(b);
    return text;
}

/* The "answer" column where it is a number (else null), plus the number of completion ids and the
 * first id / 1000. */
static char *column_scores(const char *body) {
    cJSON *b = cJSON_Parse(body), *out = cJSON_CreateArray();
    const cJSON *a = cJSON_GetObjectItem(b, "answer"), *ids = cJSON_GetObjectItem(b, "completion_ids");
    for (int i = 0; i < cJSON_GetArraySize(ids); i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i), *row = cJSON_GetArrayItem(ids, i);
        const double first = cJSON_GetArraySize(row) ? cJSON_GetArrayItem(row, 0)->valuedouble : 0;
        cJSON_AddItemToArray(out,
                             cJSON_IsNumber(v)
                                 ? cJSON_CreateNumber(v->valuedouble + cJSON_GetArraySize(row) + first / 1000)
                                 : cJSON_CreateNull());
    }
    char *text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out), cJSON_Delete(b);
    return text;
}

static void reply(int fd, int status, const char *body) {
    char head[256];
    const int n = snprintf(head, sizeof head,
                           "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                           status, strlen(body));
    send(fd, head, (size_t)n, MSG_NOSIGNAL);
    send(fd, body, strlen(body), MSG_NOSIGNAL);
}

/* One request: read whole (headers, Content-Length body), answered by its path. */
static void serve_one(int fd) {
    static char buf[1 << 20];
    size_t n = 0;
    char *sep = NULL;
    long want = -1;
    for (;;) {
        const ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k <= 0) return;
        n += (size_t)k;
        buf[n] = '\0';
        if (!sep && (sep = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            want = cl ? atol(cl + 17) : 0;
        }
        if (sep && (long)(n - (size_t)(sep + 4 - buf)) >= want) break;
    }
    const char *body = sep + 4;
    char path[256] = "";
    sscanf(buf, "POST %255s", path);
    char *scores = len_scores(body);
    if (!strcmp(path, "/len") || !strcmp(path, "/len?x=1")) {
        reply(fd, 200, scores);
    } else if (!strcmp(path, "/columns")) {
        char *c = column_scores(body);
        reply(fd, 200, c);
        free(c);
    } else if (!strcmp(path, "/object")) {
        char o[4096];
        snprintf(o, sizeof o, "{\"rewards\": %s, \"note\": \"ignored\"}", scores);
        reply(fd, 200, o);
    } else if (!strcmp(path, "/chunked")) { /* the list in two chunks */
        char o[4096];
        const size_t len = strlen(scores), half = len / 2;
        const int k = snprintf(
            o, sizeof o,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%.*s\r\n%zx\r\n%s\r\n0\r\n\r\n",
            half, (int)half, scores, len - half, scores + half);
        send(fd, o, (size_t)k, MSG_NOSIGNAL);
    } else if (!strcmp(path, "/auth")) {
        const int ok = strstr(buf, "\r\nAuthorization: Bearer s3cret\r\n") != NULL;
        reply(fd, ok ? 200 : 401, ok ? scores : "{\"detail\": \"no token\"}");
    } else if (!strcmp(path, "/flaky")) { /* dropped, then 503, then answered */
        pthread_mutex_lock(&mu);
        const int call = flaky_calls++;
        pthread_mutex_unlock(&mu);
        if (call == 1) reply(fd, 503, "busy");
        if (call >= 2) reply(fd, 200, scores);
    } else if (!strcmp(path, "/status500")) {
        reply(fd, 500, "Internal Server Error: boom");
    } else if (!strcmp(path, "/badjson")) {
        reply(fd, 200, "hello");
    } else if (!strcmp(path, "/count")) {
        reply(fd, 200, "[1]");
    } else if (!strcmp(path, "/nan")) {
        reply(fd, 200, "[NaN, 1]");
    } else if (!strcmp(path, "/inf")) {
        reply(fd, 200, "[1e999, 1]");
    } else if (!strcmp(path, "/slow")) {
        struct timespec s = {1, 0};
        nanosleep(&s, NULL);
        reply(fd, 200, scores);
    } else if (!strcmp(path, "/garbage")) {
        send(fd, "SSH-2.0-OpenSSH\r\n", 17, MSG_NOSIGNAL);
    } else {
        reply(fd, 404, "no such path");
    }
    free(scores);
}

static void *server(void *arg) {
    const int ls = *(int *)arg;
    for (;;) {
        const int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        serve_one(fd);
        close(fd);
    }
    return NULL;
}

static void setup(void) {
    if (reg) return;
    reward_case_setup("http");
    static int ls;
    ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    CHECK(bind(ls, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(ls, 16) == 0);
    getsockname(ls, (struct sockaddr *)&addr, &len);
    port = ntohs(addr.sin_port);
    pthread_t th;
    pthread_create(&th, NULL, server, &ls);
    pthread_detach(th);
}

/* A reward instance from "[reward.x]\nplugin = http\n" + `options` (%d: the server's port). */
static ctrl_reward *make(const char *options, ctrl_config **cfg) {
    char opts[1024];
    snprintf(opts, sizeof opts, options, port);
    return reward_case_make("http", opts, cfg);
}

/* TRL's scores through the server at `url_options`, three batches in a row. */
static void check_len(const char *url_options) {
    ctrl_config *cfg;
    ctrl_reward *r = make(url_options, &cfg);
    CHECK_MSG(r != NULL, "%s", url_options);
    reward_case_check_len(r, 3);
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

TEST(matches_trl_reward_len) {
    setup();
    CHECK(ops != NULL);
    if (!ops) return;
    check_len("url = http://127.0.0.1:%d/len\n");
    check_len("url = http://localhost:%d/len?x=1\n");
    check_len("url = http://127.0.0.1:%d/object\n");
    check_len("url = http://127.0.0.1:%d/chunked\n");
    setenv("CTRL_TEST_REWARD_TOKEN", "s3cret", 1);
    check_len("url = http://127.0.0.1:%d/auth\nbearer_token_env = CTRL_TEST_REWARD_TOKEN\n");
    flaky_calls = 0; /* dropped, 503, then answered: within the 2 default retries */
    check_len("url = http://127.0.0.1:%d/flaky\n");
}

TEST(columns_and_ids_reach_the_server) {
    setup();
    if (!ops) return;
    ctrl_config *cfg;
    float got[3];
    ctrl_reward *r = make("url = http://127.0.0.1:%d/columns\n", &cfg);
    CHECK(r && reward_case_score_columns(r, got) == CTRL_OK);
    CHECK(got[0] == 44.007f && isnan(got[1]) && isnan(got[2])); /* null: the reward does not apply */
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

/* A server that misbehaves: the score call fails naming the reward, the URL and the cause. */
static void expect_error(const char *options, const char *part) {
    ctrl_config *cfg;
    ctrl_reward *r = make(options, &cfg);
    CHECK(r != NULL);
    float got[2];
    if (r) {
        CHECK_EQ_INT(reward_case_score_pair(r, got), CTRL_ERR_RUNTIME);
        const char *msg = ctrl_error_message();
        CHECK_MSG(strstr(msg, "reward.x (http http://") && strstr(msg, part), "'%s' lacks '%s'", msg, part);
        ops->destroy(r);
    }
    ctrl_config_free(cfg);
}

TEST(misbehaving_servers_are_clear_errors) {
    setup();
    if (!ops) return;
    expect_error("url = http://127.0.0.1:%d/status500\n", "HTTP 500: Internal Server Error: boom");
    expect_error("url = http://127.0.0.1:%d/nowhere\n", "HTTP 404");
    expect_error("url = http://127.0.0.1:%d/badjson\n", "not a JSON list of 2");
    expect_error("url = http://127.0.0.1:%d/count\n", "not a JSON list of 2");
    expect_error("url = http://127.0.0.1:%d/nan\n", "NaN or an infinite score");
    expect_error("url = http://127.0.0.1:%d/inf\n", "NaN or an infinite score");
    expect_error("url = http://127.0.0.1:%d/garbage\n", "not an HTTP reply");
    expect_error("url = http://127.0.0.1:%d/slow\ntimeout = 0.3\n", "no reply within its timeout of 0.3 s");
    expect_error("url = http://127.0.0.1:%d/auth\n", "HTTP 401");
    flaky_calls = 0; /* dropped, then 503: one retry is not enough */
    expect_error("url = http://127.0.0.1:%d/flaky\nretries = 1\n", "HTTP 503: busy");
    /* nothing listens on a port just closed: refused, after the retries */
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    bind(s, (struct sockaddr *)&addr, sizeof addr);
    getsockname(s, (struct sockaddr *)&addr, &len);
    close(s);
    char opts[128];
    snprintf(opts, sizeof opts, "url = http://127.0.0.1:%d/len\nretries = 1\n", ntohs(addr.sin_port));
    expect_error(opts, "no answer (Connection refused), after every retry");
}

TEST(bad_urls_are_refused_naming_the_key) {
    setup();
    if (!ops) return;
    static const char *const bad[][2] = {
        {"url = https://example.com/r\n", "[reward.x] url = https://example.com/r: https is not supported"},
        {"url = ftp://x/r\n", "expected http://HOST[:PORT][/PATH]"},
        {"url = http://:80/r\n", "no host"},
        {"url = http://h:99999/r\n", "the port must be 1..65535"},
        {"url = http://h:/r\n", "the port must be 1..65535"},
        {"url = http://h/r\nbearer_token_env = CTRL_TEST_UNSET_VARIABLE\n",
         "bearer_token_env = CTRL_TEST_UNSET_VARIABLE: the environment variable is not set"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctrl_config *cfg = reward_case_config("http", bad[i][0]);
        ctrl_reward *r = NULL;
        CHECK(cfg != NULL);
        if (!cfg) continue;
        CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, "reward.x", &r), CTRL_ERR_CONFIG);
        CHECK_MSG(strstr(ctrl_error_message(), bad[i][1]), "'%s' lacks '%s'", ctrl_error_message(),
                  bad[i][1]);
        ctrl_config_free(cfg);
    }
}
