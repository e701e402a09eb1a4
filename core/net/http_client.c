/* See http_client.h. */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "net/http_client.h"

/* "http://host:port" -> host, port (80 when absent). */
static ctrl_status parse_url(const char *url, char *host, size_t hcap, char *port, size_t pcap) {
    if (strncmp(url, "http://", 7) != 0)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: only http:// URLs are supported", url);
    const char *h = url + 7, *end = h + strcspn(h, "/"), *colon = memchr(h, ':', (size_t)(end - h));
    const size_t hl = (size_t)((colon ? colon : end) - h);
    if (hl == 0 || hl >= hcap) return ctrl_error_set(CTRL_ERR_CONFIG, "%s: no host", url);
    memcpy(host, h, hl), host[hl] = '\0';
    snprintf(port, pcap, "%.*s", colon ? (int)(end - colon - 1) : 2, colon ? colon + 1 : "80");
    return CTRL_OK;
}

/* The value of header `name` among the response's header lines [head, end) (the status line
 * first); NULL when absent. *vlen is its length, surrounding blanks removed. */
static const char *header_value(const char *head, const char *end, const char *name, size_t *vlen) {
    const size_t nl = strlen(name);
    for (const char *line = head; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if ((size_t)(eol - line) > nl && !strncasecmp(line, name, nl) && line[nl] == ':') {
            const char *v = line + nl + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && isspace((unsigned char)ve[-1])) ve--;
            *vlen = (size_t)(ve - v);
            return v;
        }
        line = eol + 1;
    }
    return NULL;
}

int ctrl_http_dechunk(char *buf, size_t n, size_t *out_len) {
    size_t r = 0, w = 0;
    for (;;) {
        /* the size line: hex digits, optional ";extensions", CRLF (a bare LF tolerated) */
        size_t size = 0, digits = 0;
        while (r < n && isxdigit((unsigned char)buf[r])) {
            const int c = tolower((unsigned char)buf[r++]);
            if (size > (SIZE_MAX >> 4)) return -1; /* overflow */
            size = size * 16 + (size_t)(c <= '9' ? c - '0' : c - 'a' + 10);
            digits++;
        }
        if (!digits) return -1;
        while (r < n && (buf[r] == ' ' || buf[r] == '\t')) r++;
        if (r < n && buf[r] == ';') { /* chunk extensions: ignored */
            const char *lf = memchr(buf + r, '\n', n - r);
            r = lf ? (size_t)(lf - buf) : n;
        }
        if (r < n && buf[r] == '\r') r++;
        if (r >= n || buf[r] != '\n') return -1; /* the size line must end here */
        r++;                                     /* past LF */
        if (size == 0) break;                    /* the last chunk: trailers (ignored) follow */
        if (size > n - r) return -1;
        memmove(buf + w, buf + r, size);
        w += size, r += size;
        if (r < n && buf[r] == '\r') r++;
        if (r >= n || buf[r] != '\n') return -1; /* each chunk's data ends with CRLF */
        r++;
    }
    *out_len = w;
    buf[w] = '\0';
    return 0;
}

static ctrl_status send_all(int fd, const char *p, size_t n, const char *url) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return ctrl_error_set(CTRL_ERR_IO, "%s: send failed: %s", url, strerror(errno));
        p += k, n -= (size_t)k;
    }
    return CTRL_OK;
}

/* len bytes of f, from where it stands, in blocks of 1 MiB: a body as large as a model is never held whole.
 */
static ctrl_status send_file(int fd, FILE *f, size_t len, const char *url) {
    enum { BLOCK = 1 << 20 };
    char *block = malloc(BLOCK);
    ctrl_status st = block ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the body", url);
    while (st == CTRL_OK && len > 0) {
        const size_t want = len < BLOCK ? len : BLOCK, got = fread(block, 1, want, f);
        if (got != want) {
            st = ctrl_error_set(CTRL_ERR_IO, "%s: the body's file ended %zu bytes early", url, len - got);
            break;
        }
        st = send_all(fd, block, got, url);
        len -= got;
    }
    free(block);
    return st;
}

/* The body is len bytes: `body` in memory, or read from `body_file` (then body is NULL). */
static ctrl_status request(const char *base, const char *path, const char *method, const char *content_type,
                           const void *body, FILE *body_file, size_t len, const char *bearer, int timeout_s,
                           ctrl_http_response *out) {
    memset(out, 0, sizeof *out);
    char host[256], port[16], url[1024];
    snprintf(url, sizeof url, "%s%s", base, path);
    ctrl_status st = parse_url(base, host, sizeof host, port, sizeof port);
    if (st != CTRL_OK) return st;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", url, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {.tv_sec = timeout_s};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) close(fd), fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot connect: %s (is ctrl serve running?)", url,
                              strerror(errno));
    char head[2048];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nContent-Length: %zu\r\n", method,
                      path, host, port, len);
    if (content_type)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "Content-Type: %s\r\n", content_type);
    if (bearer) hn += snprintf(head + hn, sizeof head - (size_t)hn, "Authorization: Bearer %s\r\n", bearer);
    hn += snprintf(head + hn, sizeof head - (size_t)hn, "\r\n");
    st = send_all(fd, head, (size_t)hn, url);
    if (st == CTRL_OK && len)
        st = body_file ? send_file(fd, body_file, len, url) : send_all(fd, body, len, url);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf && st == CTRL_OK) st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the response", url);
    while (st == CTRL_OK) {
        if (n == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b)
                st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: response too large", url);
            else
                buf = b, cap *= 2;
            continue;
        }
        ssize_t k = recv(fd, buf + n, cap - n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            st = ctrl_error_set(CTRL_ERR_IO, "%s: no response within %d s: %s", url, timeout_s,
                                strerror(errno));
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    if (st != CTRL_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    const char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1) {
        free(buf);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: malformed HTTP response", url);
    }
    size_t tlen = 0, clen = 0, body_len = n - (size_t)(sep + 4 - buf);
    const char *tv = header_value(buf, sep + 2, "Transfer-Encoding", &tlen);
    const char *cv = header_value(buf, sep + 2, "Content-Length", &clen);
    char te_buf[64] = "", cl_buf[32] = ""; /* copied out: the body moves over the headers */
    const char *te = tv ? te_buf : NULL, *cl = cv ? cl_buf : NULL;
    if (tv)
        tlen = tlen < sizeof te_buf ? tlen : sizeof te_buf - 1, memcpy(te_buf, tv, tlen), te_buf[tlen] = '\0';
    if (cv)
        clen = clen < sizeof cl_buf ? clen : sizeof cl_buf - 1, memcpy(cl_buf, cv, clen), cl_buf[clen] = '\0';
    memmove(buf, sep + 4, body_len + 1);
    if (te && tlen >= 7 && !strncasecmp(te + tlen - 7, "chunked", 7)) { /* chunked is always last */
        if (ctrl_http_dechunk(buf, body_len, &body_len) != 0) {
            free(buf);
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: malformed chunked response body", url);
        }
    } else if (te && tlen && strncasecmp(te, "identity", tlen)) {
        free(buf);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: unsupported Transfer-Encoding '%.*s'", url, (int)tlen,
                              te);
    } else if (cl) {
        char *end = NULL;
        const unsigned long long want = strtoull(cl, &end, 10);
        if (end == cl || end != cl + clen || want > body_len) {
            free(buf);
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: response body of %zu bytes, Content-Length says %.*s",
                                  url, body_len, (int)clen, cl);
        }
        body_len = (size_t)want, buf[body_len] = '\0';
    }
    out->len = body_len;
    out->body = buf;
    return CTRL_OK;
}

ctrl_status ctrl_http_post(const char *base_url, const char *path, const char *content_type, const void *body,
                           size_t len, const char *bearer, int timeout_s, ctrl_http_response *out) {
    return request(base_url, path, "POST", content_type, body, NULL, len, bearer, timeout_s, out);
}

ctrl_status ctrl_http_post_file(const char *base_url, const char *path, const char *content_type, FILE *body,
                                size_t len, const char *bearer, int timeout_s, ctrl_http_response *out) {
    return request(base_url, path, "POST", content_type, NULL, body, len, bearer, timeout_s, out);
}

ctrl_status ctrl_http_get(const char *base_url, const char *path, int timeout_s, ctrl_http_response *out) {
    return request(base_url, path, "GET", NULL, NULL, NULL, 0, NULL, timeout_s, out);
}

void ctrl_http_response_free(ctrl_http_response *r) {
    free(r->body);
    r->body = NULL;
}
