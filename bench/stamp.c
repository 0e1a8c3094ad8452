/* A minimal job for the handoff benchmark: prints "S <pid> <time>" as soon as it
 * starts, sleeps the given milliseconds, prints "E <pid> <time>" just before it exits.
 * Appends to the file named by its first argument. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void stamp(FILE *f, char tag) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "%c %d %ld.%06ld\n", tag, (int)getpid(), (long)ts.tv_sec, ts.tv_nsec / 1000);
    fflush(f);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    FILE *f = fopen(argv[1], "a");
    if (!f) return 1;
    stamp(f, 'S');
    struct timespec d = {atoi(argv[2]) / 1000, (atoi(argv[2]) % 1000) * 1000000L};
    nanosleep(&d, NULL);
    stamp(f, 'E');
    return 0;
}
