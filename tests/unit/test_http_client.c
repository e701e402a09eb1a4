/* core/net/http_client.c's response framing: chunked transfer-encoding decoded (RFC 9112 7.1:
 * size lines in hex with extensions, trailers), malformed chunking refused, Content-Length
 * honoured (a longer body cut to it, a shorter one an error), an unknown transfer coding refused;
 * both through ctrl_http_dechunk and end to end from a socket server in this process that answers
 * one canned response. A body posted from a file (ctrl_http_post_file, server mode's weight push)
 * arrives whole, byte for byte, across its 1 MiB blocks; a file shorter than the length given is an error. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/http_client.h"
#include "test.h"

/* The decoded body of `in` (static), or NULL when ctrl_http_dechunk refuses it. */
static const char *dechunk(const char *in, size_t *len) {
    static char buf[512];
    const size_t n = strlen(in);
    memcpy(buf, in, n + 1);
    return ctrl_http_dechunk(buf, n, len) == 0 ? buf : NULL;
}

TEST(dechunk_valid) {
    size_t len = 0;
    CHECK_STR(dechunk("5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n", &len), "hello, world");
    CHECK_EQ_INT(len, 12);
    /* upper-case hex, an extension, trailers, a bare LF */
    CHECK_STR(dechunk("A;name=v\r\n0123456789\r\n1\nx\n0\r\nX-Trailer: 1\r\n\r\n", &len), "0123456789x");
    CHECK_EQ_INT(len, 11);
    CHECK_STR(dechunk("0\r\n\r\n", &len), "");
    CHECK_EQ_INT(len, 0);
    /* binary data with NULs and CRLFs inside a chunk */
    static char bin[64];
    memcpy(bin, "4\r\n\0\r\n\0\r\n0\r\n\r\n", 15);
    CHECK_EQ_INT(ctrl_http_dechunk(bin, 15, &len), 0);
    CHECK_EQ_INT(len, 4);
    CHECK(!memcmp(bin, "\0\r\n\0", 4));
}

TEST(dechunk_malformed) {
    size_t len = 0;
    CHECK(dechunk("", &len) == NULL);                             /* no last chunk */
    CHECK(dechunk("5\r\nhello\r\n", &len) == NULL);               /* no last chunk */
    CHECK(dechunk("zz\r\nhello\r\n0\r\n\r\n", &len) == NULL);     /* no hex digits */
    CHECK(dechunk("9\r\nhello\r\n0\r\n\r\n", &len) == NULL);      /* longer than what is left */
    CHECK(dechunk("3\r\nhello\r\n0\r\n\r\n", &len) == NULL);      /* data not followed by CRLF */
    CHECK(dechunk("5 x\r\nhello\r\n0\r\n\r\n", &len) == NULL);    /* junk after the size */
    CHECK(dechunk("5", &len) == NULL);                            /* unterminated size line */
    CHECK(dechunk("fffffffffffffffffff\r\nx\r\n", &len) == NULL); /* size overflows */
}

static const char *canned;
static int listen_fd;

/* Accepts one connection, reads the request's head, answers `canned` and closes. */
static void *serve_once(void *arg) {
    (void)arg;
    const int c = accept(listen_fd, NULL, NULL);
    if (c < 0) return NULL;
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1) {
        const ssize_t k = recv(c, req + n, sizeof req - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n")) break;
    }
    (void)!send(c, canned, strlen(canned), MSG_NOSIGNAL);
    close(c);
    return NULL;
}

/* A loopback listener on a free port served by `serve` in a thread; its base URL in base. */
static int listen_on(void *(*serve)(void *), char *base, size_t cap, pthread_t *t) {
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) || listen(listen_fd, 1) ||
        getsockname(listen_fd, (struct sockaddr *)&a, &al))
        return -1;
    snprintf(base, cap, "http://127.0.0.1:%d", ntohs(a.sin_port));
    return pthread_create(t, NULL, serve, NULL);
}

/* GET / against a server answering `response`; the status of the call, the response in *r. */
static ctrl_status get(const char *response, ctrl_http_response *r) {
    canned = response;
    char base[64];
    pthread_t t;
    if (listen_on(serve_once, base, sizeof base, &t)) return CTRL_ERR_IO;
    const ctrl_status st = ctrl_http_get(base, "/", 5, r);
    pthread_join(t, NULL);
    close(listen_fd);
    return st;
}

TEST(chunked_response_decoded) {
    ctrl_http_response r = {0};
    CHECK_EQ_INT(
        get("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding:  Chunked \r\n\r\n"
            "6\r\n{\"a\": \r\n2\r\n1}\r\n0\r\n\r\n",
            &r),
        CTRL_OK);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(r.body, "{\"a\": 1}");
    CHECK_EQ_INT(r.len, 8);
    ctrl_http_response_free(&r);
}

TEST(malformed_chunked_response_is_an_error) {
    ctrl_http_response r = {0};
    CHECK(get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n{\"a\":", &r) == CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "malformed chunked");
    CHECK(r.body == NULL);
}

TEST(content_length_honoured) {
    ctrl_http_response r = {0};
    /* a body longer than the headers it replaces in the buffer (the framing is read before) */
    CHECK_EQ_INT(get("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 65\r\n\r\n"
                     "{\"status\":\"ok\",\"a_field_name_long_enough\":\"to cover the headers\"}",
                     &r),
                 CTRL_OK);
    CHECK_EQ_INT(r.len, 65);
    ctrl_http_response_free(&r);
    CHECK_EQ_INT(get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n0\r\n\r\n",
                     &r),
                 CTRL_OK);
    CHECK_EQ_INT(r.len, 64);
    ctrl_http_response_free(&r);
    CHECK_EQ_INT(get("HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabcdef", &r), CTRL_OK);
    CHECK_EQ_INT(r.status, 404);
    CHECK_STR(r.body, "abc");
    ctrl_http_response_free(&r);
    CHECK(get("HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\nabc", &r) == CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "Content-Length");
    /* no framing header: the body runs to the connection's end */
    CHECK_EQ_INT(get("HTTP/1.0 200 OK\r\n\r\nto the end", &r), CTRL_OK);
    CHECK_STR(r.body, "to the end");
    ctrl_http_response_free(&r);
}

TEST(unknown_transfer_coding_refused) {
    ctrl_http_response r = {0};
    CHECK(get("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx", &r) == CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "gzip");
}

static unsigned char *received; /* the body the capturing server read */
static size_t received_len;

/* Accepts one connection, reads the request's head and the Content-Length bytes after it into
 * `received`, answers 200 and closes. */
static void *serve_capture(void *arg) {
    (void)arg;
    const int c = accept(listen_fd, NULL, NULL);
    if (c < 0) return NULL;
    size_t cap = 1 << 16, n = 0, want = (size_t)-1;
    char *req = malloc(cap);
    while (req && n < want) {
        if (n == cap) req = realloc(req, cap *= 2);
        const ssize_t k = req ? recv(c, req + n, cap - n, 0) : -1;
        if (k <= 0) break;
        n += (size_t)k;
        const char *end = want == (size_t)-1 ? memmem(req, n, "\r\n\r\n", 4) : NULL;
        const char *cl = end ? memmem(req, (size_t)(end - req), "Content-Length: ", 16) : NULL;
        if (cl) want = (size_t)(end + 4 - req) + strtoull(cl + 16, NULL, 10);
    }
    if (req && n == want) {
        const char *body = (const char *)memmem(req, n, "\r\n\r\n", 4) + 4;
        received_len = n - (size_t)(body - req);
        received = malloc(received_len + 1);
        memcpy(received, body, received_len);
    }
    free(req);
    canned = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    (void)!send(c, canned, strlen(canned), MSG_NOSIGNAL);
    close(c);
    return NULL;
}

/* POSTs len bytes of f to a capturing server. */
static ctrl_status post_file(FILE *f, size_t len, ctrl_http_response *r) {
    char base[64];
    pthread_t t;
    if (listen_on(serve_capture, base, sizeof base, &t)) return CTRL_ERR_IO;
    const ctrl_status st =
        ctrl_http_post_file(base, "/update_weights", "application/octet-stream", f, len, NULL, 5, r);
    if (st != CTRL_OK) shutdown(listen_fd, SHUT_RDWR); /* the server's accept returns */
    pthread_join(t, NULL);
    close(listen_fd);
    return st;
}

TEST(file_body_sent_whole) {
    const size_t len = (3u << 20) + 17; /* three full blocks and a partial one */
    unsigned char *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (unsigned char)(i * 2654435761u >> 13);
    FILE *f = tmpfile();
    CHECK(f && fwrite(data, 1, len, f) == len && fseek(f, 0, SEEK_SET) == 0);
    ctrl_http_response r = {0};
    received = NULL, received_len = 0;
    CHECK_EQ_INT(post_file(f, len, &r), CTRL_OK);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(received_len, len);
    CHECK(received && !memcmp(received, data, len));
    ctrl_http_response_free(&r);
    free(received);
    /* a file shorter than the length given: an error naming it, not a short body sent as whole */
    CHECK(fseek(f, 0, SEEK_SET) == 0);
    received = NULL;
    CHECK(post_file(f, len + 5, &r) == CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), "ended 5 bytes early");
    CHECK(received == NULL);
    free(received);
    fclose(f);
    free(data);
}
