/* NetHack's clock, pinned; every other caller's clock left alone.
 *
 * NetHack reads the date through libc: time() and gettimeofday() for "now", localtime() to turn it into a moon
 * phase, Friday the 13th, night and midnight, and mktime() for dates in its record file. The hero's birth time
 * (which seeds shopkeeper names) is "now" at the start of every game. This library, loaded with LD_PRELOAD,
 * answers those four calls with a fixed instant when (and only when) they come from a NetHack library (an object
 * that exports NLE's `nle_start`); Python, sample-factory, sqlite, git and everything else in the process see the
 * real clock. The instant is the game's local time, whatever TZ says: localtime() and mktime() of NetHack's
 * callers work in UTC.
 *
 * Python sets the instant with curio_nethack_clock_set(seconds since the epoch) before it creates an env; until
 * then NetHack too sees the real clock. Built by `make nethack-clock`; see pipeline/nethack/clock.py.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/time.h>
#include <time.h>

static volatile long long pinned;
static volatile int is_pinned;

void curio_nethack_clock_set(long long seconds) {
    pinned = seconds;
    is_pinned = 1;
}

/* The pinned instant, or -1 when none is set. */
long long curio_nethack_clock_get(void) { return is_pinned ? pinned : -1; }

/* Per loaded object (by base address): does it export nle_start? A small cache: NetHack calls these rarely. */
#define SLOTS 256
static struct { const void *base; int nethack; } cache[SLOTS];
static volatile int used;
static volatile int lock;

static int from_nethack(const void *caller) {
    Dl_info info;
    if (!is_pinned || !dladdr(caller, &info) || info.dli_fbase == NULL) return 0;
    int n = used;
    for (int i = 0; i < n && i < SLOTS; i++)
        if (cache[i].base == info.dli_fbase) return cache[i].nethack;
    int nethack = 0;
    if (info.dli_fname != NULL) {
        void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (handle != NULL) {
            nethack = dlsym(handle, "nle_start") != NULL;
            dlclose(handle);
        }
    }
    while (__sync_lock_test_and_set(&lock, 1)) {
    }
    if (used < SLOTS) {
        cache[used].base = info.dli_fbase;
        cache[used].nethack = nethack;
        __sync_synchronize();
        used = used + 1;
    }
    __sync_lock_release(&lock);
    return nethack;
}

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

time_t time(time_t *out) {
    static time_t (*real)(time_t *);
    if (from_nethack(__builtin_return_address(0))) {
        time_t now = (time_t)pinned;
        if (out != NULL) *out = now;
        return now;
    }
    if (real == NULL) real = (time_t (*)(time_t *))next("time");
    return real(out);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    static int (*real)(struct timeval *restrict, void *restrict);
    if (from_nethack(__builtin_return_address(0))) {
        if (tv != NULL) {
            tv->tv_sec = (time_t)pinned;
            tv->tv_usec = 0;
        }
        return 0;
    }
    if (real == NULL) real = (int (*)(struct timeval *restrict, void *restrict))next("gettimeofday");
    return real(tv, tz);
}

struct tm *localtime(const time_t *when) {
    static struct tm *(*real)(const time_t *);
    static __thread struct tm result;
    if (from_nethack(__builtin_return_address(0))) return gmtime_r(when, &result);
    if (real == NULL) real = (struct tm * (*)(const time_t *)) next("localtime");
    return real(when);
}

time_t mktime(struct tm *tm) {
    static time_t (*real)(struct tm *);
    if (from_nethack(__builtin_return_address(0))) return timegm(tm);
    if (real == NULL) real = (time_t (*)(struct tm *))next("mktime");
    return real(tm);
}
