/* Configuration from the environment the scheduler sets. Each variable carries an
 * "env NAME: meaning" comment: the docs' reference page is generated from them.
 * A bad value is reported once on stderr and turns the library to refusing allocations:
 * a typo must never mean "unlimited". */

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gpupool.h"

struct gp_config gp_cfg = {.log_level = GP_LOG_WARN};
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

void gp_log(int level, const char *fmt, ...)
{
    if (level > gp_cfg.log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "gpupool[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(2, buf, len); /* one write: lines from several processes stay whole */
    (void)w;
}

/* bytes, optionally with a binary suffix: 1073741824, 1024M, 16G, 16GiB */
static int parse_bytes(const char *s, const char *end, uint64_t *out)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (s == end || *s < '0' || *s > '9')
        return -1;
    uint64_t v = 0;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    unsigned shift = 0;
    if (s < end) {
        switch (*s == 0 ? 0 : (*s | 0x20)) {
        case 'k': shift = 10; break;
        case 'm': shift = 20; break;
        case 'g': shift = 30; break;
        case 't': shift = 40; break;
        default: return -1;
        }
        s++;
        if (s < end && (*s | 0x20) == 'i')
            s++;
        if (s < end && (*s | 0x20) == 'b')
            s++;
        if (s != end)
            return -1;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

static int parse_uint(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void bad(const char *var, const char *val)
{
    gp_cfg.mode = GP_MODE_REFUSE;
    gp_log(GP_LOG_ERROR, "invalid %s=\"%s\": refusing GPU memory allocations", var, val);
}

static void load(void)
{
    struct gp_config *c = &gp_cfg;
    const char *v;
    for (int i = 0; i < GP_MAX_DEV; i++)
        c->limit[i] = GP_UNLIMITED;
    c->compute_period_ns = 100ull * 1000 * 1000;
    c->reap_interval_ns = 1000ull * 1000 * 1000;
    snprintf(c->region_path, sizeof c->region_path, "%s", "/dev/shm/gpupool-account");

    /* env GPUPOOL_LOG_LEVEL: `error`, `warn` (default), `info`, `debug` (or 0-3). `debug` traces
     * every `cuGetProcAddress` look-up. Nothing is logged on the hot paths. */
    if ((v = getenv("GPUPOOL_LOG_LEVEL")) && *v) {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        int lvl = -1;
        for (int i = 0; i < 4; i++)
            if (strcasecmp(v, names[i]) == 0 || (v[0] == '0' + i && !v[1]))
                lvl = i;
        if (lvl < 0)
            bad("GPUPOOL_LOG_LEVEL", v);
        else
            c->log_level = lvl;
    }
    enum gp_mode mode = GP_MODE_OFF;
    /* env GPUPOOL_MEMORY_LIMIT: memory cap in bytes per device, by CUDA ordinal (after
     * `CUDA_VISIBLE_DEVICES`). One value applies to every device; a comma-separated list gives
     * device 0, 1, ...; devices past the end of a list get no memory. Binary suffixes `K`,
     * `M`, `G`, `T` (`16G`, `512MiB`) are accepted. Unset or empty: no memory limit, and
     * every call passes through unchanged. */
    if ((v = getenv("GPUPOOL_MEMORY_LIMIT")) && *v) {
        /* one value for every device, or a comma-separated list by CUDA ordinal; devices
         * past the end of a list get no memory (fail closed) */
        int n = 0, ok = 1;
        const char *p = v;
        while (ok) {
            const char *comma = strchr(p, ',');
            const char *end = comma ? comma : p + strlen(p);
            uint64_t b;
            if (n >= GP_MAX_DEV || parse_bytes(p, end, &b) != 0)
                ok = 0;
            else
                c->limit[n++] = b;
            if (!comma)
                break;
            p = comma + 1;
        }
        if (!ok) {
            bad("GPUPOOL_MEMORY_LIMIT", v);
        } else {
            mode = GP_MODE_LIMIT;
            for (int i = n; i < GP_MAX_DEV; i++)
                c->limit[i] = n == 1 ? c->limit[0] : 0;
        }
    }
    /* env GPUPOOL_COMPUTE_SHARE: percentage of SM time, 1-100 (100 or unset: off). Kernel
     * launches (`cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
     * `cuGraphLaunch` and their `_ptsz` variants) are admitted only during the first SHARE
     * percent of each period. */
    if ((v = getenv("GPUPOOL_COMPUTE_SHARE")) && *v) {
        uint64_t pct;
        if (parse_uint(v, 1, 100, &pct) != 0)
            bad("GPUPOOL_COMPUTE_SHARE", v);
        else
            c->compute_share = (unsigned)pct;
    }
    /* env GPUPOOL_COMPUTE_PERIOD_MS: period of the compute share in ms, 1-10000, default 100. */
    if ((v = getenv("GPUPOOL_COMPUTE_PERIOD_MS")) && *v) {
        uint64_t ms;
        if (parse_uint(v, 1, 10000, &ms) != 0)
            bad("GPUPOOL_COMPUTE_PERIOD_MS", v);
        else
            c->compute_period_ns = ms * 1000 * 1000;
    }
    /* env GPUPOOL_REAP_INTERVAL_MS: how often (ms, 1-3600000, default 1000) an allocation also
     * looks for dead processes whose memory to reclaim. */
    if ((v = getenv("GPUPOOL_REAP_INTERVAL_MS")) && *v) {
        uint64_t ms;
        if (parse_uint(v, 1, 3600 * 1000, &ms) != 0)
            bad("GPUPOOL_REAP_INTERVAL_MS", v);
        else
            c->reap_interval_ns = ms * 1000 * 1000;
    }
    /* env GPUPOOL_SHARED_REGION: absolute path of the container's shared account, default
     * `/dev/shm/gpupool-account`. All processes of one container must see the same file (one
     * per container: `/dev/shm` is per container on Kubernetes; the embedded launcher passes a
     * per-workload path, created beforehand and owned by the workload's account). Made mode 0600
     * when missing; a file another account owns, or that others may write, is refused. */
    if ((v = getenv("GPUPOOL_SHARED_REGION")) && *v) {
        if (v[0] != '/' || strlen(v) >= sizeof c->region_path)
            bad("GPUPOOL_SHARED_REGION", v);
        else
            snprintf(c->region_path, sizeof c->region_path, "%s", v);
    }
    if (c->mode != GP_MODE_REFUSE)
        c->mode = mode;
    gp_compute_on = c->mode != GP_MODE_REFUSE && c->compute_share > 0 && c->compute_share < 100;
    gp_log(GP_LOG_INFO, "mode %d, limit[0] %llu, compute share %u%%, region %s", c->mode,
           (unsigned long long)c->limit[0], c->compute_share, c->region_path);
}

void gp_config_load(void) { pthread_once(&cfg_once, load); }

uint64_t gp_limit(int dev)
{
    if (gp_cfg.mode == GP_MODE_REFUSE)
        return 0;
    if (dev < 0 || dev >= GP_MAX_DEV)
        return gp_cfg.mode == GP_MODE_OFF ? GP_UNLIMITED : 0;
    return gp_cfg.limit[dev];
}
