/* The holder's command in the failover rows (4 and 10): overwrites FILE with
 * "<pid> <time>" every millisecond until it dies, so that the harness learns when it
 * stopped from a timestamp it wrote itself (its last beat), not from a poll.
 * With GO and KILLED: once GO exists it writes the time to KILLED, SIGKILLs its parent
 * (the lock holder) and beats on.
 *
 *   beat FILE [GO KILLED]
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Fixed width, so that each beat overwrites the whole previous one. */
#define WIDTH 40

static int now(char *buf, size_t size) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return snprintf(buf, size, "%ld.%06ld", (long)ts.tv_sec, ts.tv_nsec / 1000);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 4) return 2;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return 1;
    int armed = argc == 4;
    struct timespec ms = {0, 1000000L};
    for (;;) {
        char t[32], line[WIDTH + 1];
        now(t, sizeof t);
        int n = snprintf(line, sizeof line, "%d %s", (int)getpid(), t);
        memset(line + n, ' ', WIDTH - 1 - n);
        line[WIDTH - 1] = '\n';
        if (pwrite(fd, line, WIDTH, 0) != WIDTH) return 1;
        if (armed && access(argv[2], F_OK) == 0) {
            armed = 0;
            FILE *k = fopen(argv[3], "w");
            if (!k) return 1;
            now(t, sizeof t);
            fprintf(k, "%s\n", t);
            fclose(k);
            kill(getppid(), SIGKILL);
        }
        nanosleep(&ms, NULL);
    }
}
