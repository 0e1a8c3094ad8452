/* A minimal job for the handoff benchmark: prints "S <id> <time>" as soon as it
 * starts, sleeps the given milliseconds, prints "E <id> <time>" just before it exits.
 * Appends to the file named by its first argument. The id is the pid and the start
 * time: pids come round again within a second on a busy machine. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void stamp(FILE *f, char tag, const char *id, const struct timespec *ts) {
    fprintf(f, "%c %s %ld.%06ld\n", tag, id, (long)ts->tv_sec, ts->tv_nsec / 1000);
    fflush(f);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    struct timespec start, end;
    clock_gettime(CLOCK_REALTIME, &start);
    FILE *f = fopen(argv[1], "a");
    if (!f) return 1;
    char id[64];
    snprintf(id, sizeof id, "%d-%ld.%09ld", (int)getpid(), (long)start.tv_sec, start.tv_nsec);
    stamp(f, 'S', id, &start);
    struct timespec d = {atoi(argv[2]) / 1000, (atoi(argv[2]) % 1000) * 1000000L};
    nanosleep(&d, NULL);
    clock_gettime(CLOCK_REALTIME, &end);
    stamp(f, 'E', id, &end);
    return 0;
}
