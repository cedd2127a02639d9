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

/* Whether the code at `caller` lies in a NetHack library (an object that exports nle_start): dladdr() walks the
 * loader's list of objects under its lock, so it is slow, and asked once per call site (below). */
static int in_nethack(const void *caller) {
    Dl_info info;
    if (!dladdr(caller, &info) || info.dli_fbase == NULL || info.dli_fname == NULL) return 0;
    void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL) return 0;
    int nethack = dlsym(handle, "nle_start") != NULL;
    dlclose(handle);
    return nethack;
}

/* The answer per call site (return address), kept once found. Once the clock is pinned, every clock call in the
 * process comes through here, from NetHack or not: oneDNN reads the time on each primitive it runs, so asking
 * dladdr() on every call made each small convolution of a NetHack agent's encoder about 65 times slower
 * (bench/bench_nethack_clock.py). A process has few call sites (a handful per library, NLE's per-env copies of
 * NetHack included): an open-addressed table, read without a lock (a site is published after its answer), written
 * under one; when full, dladdr() answers. As with the per-object answer it replaces, an answer would outlive its
 * object if another were loaded at the same address after it was unloaded. */
#define SITES 4096
static struct { const void *site; int nethack; } sites[SITES];
static volatile int lock;

static int from_nethack(const void *caller) {
    if (!is_pinned) return 0;
    size_t start = ((size_t)caller >> 4) % SITES;
    for (size_t i = 0; i < SITES; i++) {
        size_t slot = (start + i) % SITES;
        const void *site = __atomic_load_n(&sites[slot].site, __ATOMIC_ACQUIRE);
        if (site == caller) return __atomic_load_n(&sites[slot].nethack, __ATOMIC_RELAXED);
        if (site == NULL) break;
    }
    int nethack = in_nethack(caller);
    while (__sync_lock_test_and_set(&lock, 1)) {
    }
    for (size_t i = 0; i < SITES; i++) {
        size_t slot = (start + i) % SITES;
        const void *site = __atomic_load_n(&sites[slot].site, __ATOMIC_RELAXED);
        if (site == caller) break;  /* another thread kept it meanwhile */
        if (site == NULL) {
            __atomic_store_n(&sites[slot].nethack, nethack, __ATOMIC_RELAXED);
            __atomic_store_n(&sites[slot].site, caller, __ATOMIC_RELEASE);
            break;
        }
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
