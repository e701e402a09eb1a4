/* A loopback TCP port free right now (the kernel picks it: bind to port 0, read it back, close), for
 * the tests that start `ctrl serve` in-process. 0 when none could be had. */
#ifndef CTRL_TESTS_SERVE_FREE_PORT_H
#define CTRL_TESTS_SERVE_FREE_PORT_H

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

#endif
