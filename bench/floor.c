/* The protocol floor for benchmark row 1: what running a command under a Consul lock
 * costs with nothing but the wire steps. One keep-alive connection, four requests
 * (session create, acquire, release, session destroy) around a posix_spawn of the
 * command, and no safety machinery at all: no guardian, no renewals, no supervision.
 *
 *   CONSUL_HTTP_ADDR=127.0.0.1:8500 floor KEY COMMAND [ARGS...]
 *
 * The address must be an IPv4 literal. Exits with the command's status; 70 if a
 * request fails. Not a lock client to use: it is the yardstick conlock is measured by. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static int fd;
static char resp[65536];

/* Sends one request and reads the whole response into resp; returns its body. */
static char *request(const char *method, const char *path, const char *body) {
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: consul\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, strlen(body), body);
    if (n <= 0 || n >= (int)sizeof req || write(fd, req, n) != n) exit(70);
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, resp + got, sizeof resp - 1 - got);
        if (r <= 0) exit(70);
        got += r;
        resp[got] = 0;
        char *end = strstr(resp, "\r\n\r\n");
        char *len = strstr(resp, "Content-Length: ");
        if (!len) len = strstr(resp, "content-length: ");
        if (end && len && got >= (size_t)(end + 4 - resp) + strtoul(len + 16, 0, 10)) {
            if (strncmp(resp + 9, "200", 3) != 0) exit(70);
            return end + 4;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *addr = getenv("CONSUL_HTTP_ADDR");
    if (!addr) addr = "127.0.0.1:8500";
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon - addr >= (long)sizeof host) return 2;
    memcpy(host, addr, colon - addr);
    host[colon - addr] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return 2;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return 70;

    char *body = request("PUT", "/v1/session/create",
                         "{\"Name\":\"floor\",\"TTL\":\"15s\",\"LockDelay\":\"15s\",\"Behavior\":\"release\"}");
    /* {"ID": "…"}, pretty-printed or not. */
    char *id = strstr(body, "\"ID\"");
    if (!id || !(id = strchr(id + 4, '"'))) return 70;
    char session[64];
    if (sscanf(id + 1, "%63[^\"]", session) != 1) return 70;
    char path[1024];
    snprintf(path, sizeof path, "/v1/kv/%s?acquire=%s", argv[1], session);
    if (strncmp(request("PUT", path, "floor"), "true", 4) != 0) return 70;

    pid_t pid;
    int status = 0;
    if (posix_spawnp(&pid, argv[2], NULL, NULL, argv + 2, environ) != 0) return 127;
    waitpid(pid, &status, 0);

    snprintf(path, sizeof path, "/v1/kv/%s?release=%s", argv[1], session);
    request("PUT", path, "floor");
    snprintf(path, sizeof path, "/v1/session/destroy/%s", session);
    request("PUT", path, "");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
