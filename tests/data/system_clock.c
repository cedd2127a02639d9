/* The tests' stand-in for libfaketime: the whole process (Python, NetHack, everything) sees the system clock
 * moved to $FAKE_SYSTEM_DATE (seconds since the epoch), running on from there. Loaded with LD_PRELOAD after
 * Curio's own library, it plays the machine's date being a full moon or a Friday the 13th. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static time_t offset(void) {
    static int ready;
    static time_t shift;
    if (!ready) {
        int (*real)(clockid_t, struct timespec *) = dlsym(RTLD_NEXT, "clock_gettime");
        struct timespec now;
        real(CLOCK_REALTIME, &now);
        const char *target = getenv("FAKE_SYSTEM_DATE");
        shift = target ? (time_t)atoll(target) - now.tv_sec : 0;
        ready = 1;
    }
    return shift;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    static int (*real)(struct timeval *restrict, void *restrict);
    if (!real) real = dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0) tv->tv_sec += offset();
    return rc;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}
