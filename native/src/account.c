/* The per-container account: one shared-memory region (GPUPOOL_SHARED_REGION) that every
 * process of the container maps. Totals per device and one slot per process, guarded by a
 * robust process-shared mutex: a process killed while holding it leaves no stuck lock (the
 * next locker gets EOWNERDEAD and rebuilds the totals from the live slots), and the memory
 * of a dead process is reclaimed by whichever process next reaps (at most every
 * GPUPOOL_REAP_INTERVAL_MS on an allocation, on every memory query, and before any
 * allocation is refused). Reservation happens before the driver is called and is rolled
 * back if the driver fails, so racing processes never exceed the limit together. */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpupool.h"

#define GP_REGION_MAGIC 0x67707032u /* "gpp2" */
#define GP_MAX_PROCS 512

struct gp_slot {
    int32_t pid;
    uint32_t pad;
    uint64_t start_time; /* /proc/<pid>/stat field 22: tells a reused pid apart */
    uint64_t used[GP_MAX_DEV];
};

/* The activity counters sit at fixed offsets right after the header, outside the lock:
 * the hub's culler reads them from the file (hub_ext/activity.py) without taking part in
 * the account. Launches and allocations of every process of the container add to them. */
struct gp_region {
    uint32_t magic;
    uint32_t layout;          /* sizeof(struct gp_region): processes must agree */
    uint64_t launches;        /* offset 8: kernel and graph launches */
    uint64_t allocs;          /* offset 16: allocations and frees */
    uint64_t last_active_ms;  /* offset 24: wall clock (ms since the epoch) of the last one */
    pthread_mutex_t lock;
    uint64_t last_reap_ns;
    uint64_t used[GP_MAX_DEV];
    struct gp_slot slots[GP_MAX_PROCS];
};

static struct gp_region *R;
static int my_slot = -1;
static pid_t my_pid;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static int attach_failed;

/* ---------------------------------------------------------------- process identity */

static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    /* field 3 is the state; the start time is field 22 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (!p)
        return -1;
    *start = strtoull(p, NULL, 10);
    return 0;
}

static int slot_dead(const struct gp_slot *s)
{
    if (kill(s->pid, 0) != 0 && errno == ESRCH)
        return 1;
    char state;
    uint64_t start;
    if (proc_stat(s->pid, &state, &start) != 0)
        return 0; /* cannot tell: keep it */
    return state == 'Z' || state == 'X' || (s->start_time && start != s->start_time);
}

/* ---------------------------------------------------------------- the region */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void rebuild_totals(void)
{
    for (int d = 0; d < GP_MAX_DEV; d++) {
        uint64_t sum = 0;
        for (int i = 0; i < GP_MAX_PROCS; i++)
            if (R->slots[i].pid)
                sum += R->slots[i].used[d];
        R->used[d] = sum;
    }
}

static void reap_locked(uint64_t now)
{
    R->last_reap_ns = now;
    for (int i = 0; i < GP_MAX_PROCS; i++) {
        struct gp_slot *s = &R->slots[i];
        if (!s->pid || i == my_slot || !slot_dead(s))
            continue;
        for (int d = 0; d < GP_MAX_DEV; d++) {
            R->used[d] -= s->used[d] <= R->used[d] ? s->used[d] : R->used[d];
            s->used[d] = 0;
        }
        gp_log(GP_LOG_INFO, "reclaimed the memory of dead process %d", (int)s->pid);
        s->pid = 0;
    }
}

static int lock_region(void)
{
    int e = pthread_mutex_lock(&R->lock);
    if (e == EOWNERDEAD) {
        /* the holder died mid-update: the slots are the truth, the totals follow */
        gp_log(GP_LOG_WARN, "a process died holding the account lock; recovering");
        reap_locked(now_ns());
        rebuild_totals();
        pthread_mutex_consistent(&R->lock);
        e = 0;
    }
    return e;
}

static void unlock_region(void) { pthread_mutex_unlock(&R->lock); }

#ifdef GP_TEST_SEAMS
/* test build only: hold the lock until killed, so a test can SIGKILL a holder */
/* env GPUPOOL_TEST_STALL_LOCKED: test builds only (GP_TEST_SEAMS): a file path; the process
 * creates it once it holds the account's lock and then waits there until killed. */
static void test_stall_locked(void)
{
    const char *f = getenv("GPUPOOL_TEST_STALL_LOCKED");
    if (!f || !*f)
        return;
    int fd = open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
    for (;;)
        pause();
}
#else
static void test_stall_locked(void) {}
#endif

static int init_region(struct gp_region *r)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) || pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) ||
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) || pthread_mutex_init(&r->lock, &a))
        return -1;
    pthread_mutexattr_destroy(&a);
    r->layout = sizeof *r;
    __atomic_store_n(&r->magic, GP_REGION_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* The account file: opened, never through a link, or else created by this process, mode
 * 0600. An account another local user could write would let that user lift this workload's
 * cap or fail its allocations, so an existing file is used only when region_trusted(). In
 * embedded mode the launcher creates the file beforehand, owned by the workload's account,
 * in a folder only the hub may write (hub_ext/host/regions.py). */
static int open_region(const char *path)
{
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 || errno != ENOENT)
            return fd;
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd; /* else another process made it first: open that one */
    }
    return -1;
}

/* a regular file owned by this process's account (root may use any), writable by no one else */
static int region_trusted(const struct stat *st)
{
    uid_t me = geteuid();
    return S_ISREG(st->st_mode) && (st->st_uid == me || me == 0) && !(st->st_mode & 077);
}

static int do_attach(void)
{
    const char *path = gp_config()->region_path;
    int fd = open_region(path);
    if (fd < 0) {
        gp_log(GP_LOG_ERROR, "cannot open the shared account %s: %s; refusing allocations",
               path, strerror(errno));
        return -1;
    }
    struct gp_region *r = MAP_FAILED;
    struct stat st;
    if (fstat(fd, &st) != 0 || !region_trusted(&st)) {
        gp_log(GP_LOG_ERROR, "the shared account %s is not a file of this account's that only it "
               "may write (owner uid %u, mode %03o); refusing allocations", path,
               (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
        close(fd);
        return -1;
    }
    /* the first process sizes and initialises the region under flock; flock goes away with
     * a process that dies half-way, and the next one starts over */
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0) {
        if ((size_t)st.st_size < sizeof *r && ftruncate(fd, sizeof *r) != 0)
            st.st_size = -1;
        if (st.st_size >= 0)
            r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (r != MAP_FAILED && __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != GP_REGION_MAGIC &&
            init_region(r) != 0) {
            munmap(r, sizeof *r);
            r = MAP_FAILED;
        }
        flock(fd, LOCK_UN);
    }
    close(fd);
    if (r == MAP_FAILED || r->layout != sizeof *r) {
        gp_log(GP_LOG_ERROR, "cannot use the shared account %s; refusing allocations", path);
        if (r != MAP_FAILED)
            munmap(r, sizeof *r);
        return -1;
    }
    R = r;
    return 0;
}

static void after_fork_child(void);

/* the account, with this process owning a slot; NULL when unusable */
static struct gp_region *attach(void)
{
    if (GP_LIKELY(R != NULL && my_slot >= 0 && my_pid != 0))
        return R;
    pthread_mutex_lock(&attach_mu);
    if (!R && !attach_failed) {
        if (do_attach() != 0)
            attach_failed = 1;
        else
            pthread_atfork(NULL, NULL, after_fork_child);
    }
    if (R && my_slot < 0) {
        pid_t pid = getpid();
        char state;
        uint64_t start = 0;
        proc_stat(pid, &state, &start);
        if (lock_region() == 0) {
            for (int pass = 0; pass < 2 && my_slot < 0; pass++) {
                if (pass == 1)
                    reap_locked(now_ns());
                for (int i = 0; i < GP_MAX_PROCS; i++)
                    if (R->slots[i].pid == 0) {
                        memset(&R->slots[i], 0, sizeof R->slots[i]);
                        R->slots[i].pid = pid;
                        R->slots[i].start_time = start;
                        my_slot = i;
                        my_pid = pid;
                        break;
                    }
            }
            unlock_region();
        }
        if (my_slot < 0)
            gp_log(GP_LOG_ERROR, "the shared account has no free process slot");
    }
    pthread_mutex_unlock(&attach_mu);
    return (R && my_slot >= 0) ? R : NULL;
}

static void touch_activity(uint64_t *counter)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&R->last_active_ms, (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u,
                     __ATOMIC_RELAXED);
}

/* only where the library has something to enforce: without a limit nothing is touched */
void gp_activity_launch(void)
{
    if (gp_cfg.mode != GP_MODE_LIMIT && !gp_compute_on)
        return;
    if (GP_LIKELY(R != NULL) || attach())
        touch_activity(&R->launches);
}

static void activity_alloc(void)
{
    if (R)
        touch_activity(&R->allocs);
}

int gp_account_reserve(int dev, uint64_t bytes)
{
    uint64_t limit = gp_limit(dev);
    if (limit == GP_UNLIMITED)
        return 0;
    if (gp_cfg.mode == GP_MODE_REFUSE || dev < 0 || dev >= GP_MAX_DEV || !attach() || lock_region() != 0)
        return -1;
    uint64_t now = now_ns();
    if (now - R->last_reap_ns > gp_cfg.reap_interval_ns)
        reap_locked(now);
    int ok = bytes <= limit && R->used[dev] <= limit - bytes;
    if (!ok) {
        reap_locked(now);
        ok = bytes <= limit && R->used[dev] <= limit - bytes;
    }
    if (ok) {
        activity_alloc();
        R->used[dev] += bytes;
        test_stall_locked();
        R->slots[my_slot].used[dev] += bytes;
    }
    unlock_region();
    return ok ? 0 : -1;
}

void gp_account_adjust(int dev, int64_t delta)
{
    if (gp_limit(dev) == GP_UNLIMITED || gp_cfg.mode == GP_MODE_REFUSE || dev < 0 || dev >= GP_MAX_DEV || !attach() ||
        lock_region() != 0)
        return;
    struct gp_slot *s = &R->slots[my_slot];
    activity_alloc();
    if (delta < 0) {
        uint64_t d = (uint64_t)-delta;
        if (d > s->used[dev])
            d = s->used[dev];
        s->used[dev] -= d;
        R->used[dev] -= d <= R->used[dev] ? d : R->used[dev];
    } else {
        s->used[dev] += (uint64_t)delta;
        R->used[dev] += (uint64_t)delta;
    }
    unlock_region();
}

void gp_account_release(int dev, uint64_t bytes)
{
    if (bytes <= (uint64_t)INT64_MAX)
        gp_account_adjust(dev, -(int64_t)bytes);
}

uint64_t gp_account_used(int dev)
{
    if (gp_cfg.mode == GP_MODE_REFUSE || dev < 0 || dev >= GP_MAX_DEV || !attach() || lock_region() != 0)
        return 0;
    reap_locked(now_ns());
    uint64_t u = R->used[dev];
    unlock_region();
    return u;
}

/* a normal exit frees everything on the GPU: give the slot back now, not at the next reap */
__attribute__((destructor)) static void release_slot(void)
{
    if (!R || my_slot < 0 || my_pid != getpid() || lock_region() != 0)
        return;
    struct gp_slot *s = &R->slots[my_slot];
    for (int d = 0; d < GP_MAX_DEV; d++) {
        R->used[d] -= s->used[d] <= R->used[d] ? s->used[d] : R->used[d];
        s->used[d] = 0;
    }
    s->pid = 0;
    my_slot = -1;
    unlock_region();
}

/* ---------------------------------------------------------------- this process's allocations */
/* open addressing, linear probing, backward-shift deletion; key = (kind, handle) */

struct gp_entry {
    uint64_t key;
    uint64_t bytes;
    int32_t kind; /* 0 = empty */
    int32_t dev;
};

static struct gp_entry *tab;
static size_t tab_cap, tab_len;
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(uint64_t key, int kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int tab_grow(void)
{
    size_t cap = tab_cap ? tab_cap * 2 : 1024;
    struct gp_entry *n = calloc(cap, sizeof *n);
    if (!n)
        return -1;
    for (size_t i = 0; i < tab_cap; i++) {
        if (!tab[i].kind)
            continue;
        size_t j = slot_of(tab[i].key, tab[i].kind, cap);
        while (n[j].kind)
            j = (j + 1) & (cap - 1);
        n[j] = tab[i];
    }
    free(tab);
    tab = n;
    tab_cap = cap;
    return 0;
}

int gp_track_add(uint64_t key, int kind, int dev, uint64_t bytes)
{
    int rc = 0;
    pthread_mutex_lock(&tab_mu);
    if ((tab_len + 1) * 2 > tab_cap && tab_grow() != 0) {
        rc = -1;
    } else {
        size_t j = slot_of(key, kind, tab_cap);
        while (tab[j].kind && !(tab[j].kind == kind && tab[j].key == key))
            j = (j + 1) & (tab_cap - 1);
        if (!tab[j].kind)
            tab_len++;
        tab[j] = (struct gp_entry){key, bytes, kind, dev};
    }
    pthread_mutex_unlock(&tab_mu);
    return rc;
}

int gp_track_take(uint64_t key, int kind, int *dev, uint64_t *bytes)
{
    int rc = -1;
    pthread_mutex_lock(&tab_mu);
    if (tab_cap) {
        size_t j = slot_of(key, kind, tab_cap);
        while (tab[j].kind && !(tab[j].kind == kind && tab[j].key == key))
            j = (j + 1) & (tab_cap - 1);
        if (tab[j].kind) {
            *dev = tab[j].dev;
            *bytes = tab[j].bytes;
            rc = 0;
            tab_len--;
            /* backward shift: pull later members of the run into the hole */
            size_t hole = j;
            for (size_t k = (j + 1) & (tab_cap - 1); tab[k].kind; k = (k + 1) & (tab_cap - 1)) {
                size_t home = slot_of(tab[k].key, tab[k].kind, tab_cap);
                /* move k into hole unless its home lies cyclically in (hole, k] */
                int stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
                if (!stays) {
                    tab[hole] = tab[k];
                    hole = k;
                }
            }
            tab[hole].kind = 0;
        }
    }
    pthread_mutex_unlock(&tab_mu);
    return rc;
}

/* The child of a fork owns no GPU memory (CUDA does not survive fork): a fresh slot and an
 * empty table, taken lazily on its first allocation. */
static void after_fork_child(void)
{
    my_slot = -1;
    my_pid = 0;
    pthread_mutex_init(&attach_mu, NULL);
    pthread_mutex_init(&tab_mu, NULL);
    free(tab);
    tab = NULL;
    tab_cap = tab_len = 0;
}
