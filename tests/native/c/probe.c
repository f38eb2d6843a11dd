/* probe: drives the driver API through one lookup path and prints one line per command.
 *
 *   probe VIA CMD...     VIA = link | dlsym | dlvsym | getproc | getproc_v2 | getproc_ptsz
 *
 * Commands: init, ctx:D, alloc:N, free, pitch:W:H, managed:N, create:D:N, release,
 * async:N, async_ptsz:N, pool:N, pool_ptsz:N, freeasync, array:W:H, array3d:W:H:D,
 * arraydestroy, mipmap:W:H:L, mipmapdestroy, info, total:D, thread_create:D:N,
 * launch:N, fill:N (allocate N-byte blocks until refused; prints how many), nvml,
 * procaddr, touch:PATH, wait_file:PATH, sleep:MS, hold, fork ... join, exit.
 * Sizes take K/M/G suffixes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <nvml.h>

static const char *via;
static void *libcuda;
static PFN_cuGetProcAddress_v11030 gpa1;
static PFN_cuGetProcAddress_v12000 gpa2;
static const char *tag = "";

struct fn {
    const char *name, *base;
    int version, ptsz;
    void *p;
};
static struct fn fns[] = {
    {"cuInit", "cuInit", 2000, 0, 0},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, 0, 0},
    {"cuCtxSetCurrent", "cuCtxSetCurrent", 4000, 0, 0},
    {"cuStreamCreate", "cuStreamCreate", 2000, 0, 0},
    {"cuMemAlloc_v2", "cuMemAlloc", 3020, 0, 0},
    {"cuMemFree_v2", "cuMemFree", 3020, 0, 0},
    {"cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, 0, 0},
    {"cuMemAllocManaged", "cuMemAllocManaged", 6000, 0, 0},
    {"cuMemCreate", "cuMemCreate", 10020, 0, 0},
    {"cuMemRelease", "cuMemRelease", 10020, 0, 0},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, 0, 0},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020, 1, 0},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, 0, 0},
    {"cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", 11020, 1, 0},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, 0, 0},
    {"cuArrayCreate_v2", "cuArrayCreate", 3020, 0, 0},
    {"cuArray3DCreate_v2", "cuArray3DCreate", 3020, 0, 0},
    {"cuArrayDestroy", "cuArrayDestroy", 2000, 0, 0},
    {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 5000, 0, 0},
    {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 5000, 0, 0},
    {"cuMemGetInfo_v2", "cuMemGetInfo", 3020, 0, 0},
    {"cuDeviceTotalMem_v2", "cuDeviceTotalMem", 3020, 0, 0},
    {"cuLaunchKernel", "cuLaunchKernel", 4000, 0, 0},
    {"cuLaunchKernel_ptsz", "cuLaunchKernel", 7000, 1, 0},
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 9000, 0, 0},
    {"cuLaunchCooperativeKernel_ptsz", "cuLaunchCooperativeKernel", 9000, 1, 0},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 11060, 0, 0},
    {"cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", 11060, 1, 0},
    {"cuGraphLaunch", "cuGraphLaunch", 10000, 0, 0},
    {"cuGraphLaunch_ptsz", "cuGraphLaunch", 10000, 1, 0},
};
#define NFNS (sizeof fns / sizeof fns[0])

#ifdef PROBE_LINKED
/* linked with -lcuda: take the addresses the dynamic linker bound */
#undef cuGetProcAddress
extern CUresult cuStreamCreate(CUstream *, unsigned int);
extern CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
extern CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
extern CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, CUstream, void **, void **);
extern CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, unsigned, unsigned, CUstream, void **);
extern CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
extern CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
static void *linked(const char *n)
{
#define L(x) if (!strcmp(n, #x)) return (void *)&x;
    L(cuInit) L(cuDevicePrimaryCtxRetain) L(cuCtxSetCurrent) L(cuStreamCreate) L(cuMemAlloc_v2)
    L(cuMemFree_v2) L(cuMemAllocPitch_v2) L(cuMemAllocManaged) L(cuMemCreate) L(cuMemRelease)
    L(cuMemAllocAsync) L(cuMemAllocAsync_ptsz) L(cuMemAllocFromPoolAsync)
    L(cuMemAllocFromPoolAsync_ptsz) L(cuMemFreeAsync) L(cuArrayCreate_v2) L(cuArray3DCreate_v2)
    L(cuArrayDestroy) L(cuMipmappedArrayCreate) L(cuMipmappedArrayDestroy) L(cuMemGetInfo_v2)
    L(cuDeviceTotalMem_v2) L(cuLaunchKernel) L(cuLaunchKernel_ptsz) L(cuLaunchCooperativeKernel)
    L(cuLaunchCooperativeKernel_ptsz) L(cuLaunchKernelEx) L(cuLaunchKernelEx_ptsz)
    L(cuGraphLaunch) L(cuGraphLaunch_ptsz)
#undef L
    return NULL;
}
#endif

static void resolve(void)
{
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!libcuda) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    gpa1 = (PFN_cuGetProcAddress_v11030)dlsym(libcuda, "cuGetProcAddress");
    gpa2 = (PFN_cuGetProcAddress_v12000)dlsym(libcuda, "cuGetProcAddress_v2");
    for (size_t i = 0; i < NFNS; i++) {
        struct fn *f = &fns[i];
        if (!strcmp(via, "link")) {
#ifdef PROBE_LINKED
            f->p = linked(f->name);
#endif
        } else if (!strcmp(via, "dlsym")) {
            f->p = dlsym(libcuda, f->name);
        } else if (!strcmp(via, "dlvsym")) {
            f->p = dlvsym(libcuda, f->name, "libcuda.so.1");
        } else if (!strcmp(via, "getproc")) {
            gpa1(f->base, &f->p, 12090, f->ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
        } else {
            /* getproc_v2; getproc_ptsz asks every name with the per-thread flag, as a
             * runtime built for --default-stream per-thread does */
            int ptsz = f->ptsz || !strcmp(via, "getproc_ptsz");
            CUdriverProcAddressQueryResult st;
            gpa2(f->base, &f->p, 12090, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
        }
        if (!f->p) {
            fprintf(stderr, "probe: %s not resolved via %s\n", f->name, via);
            exit(2);
        }
    }
}

static void *F(const char *name)
{
    for (size_t i = 0; i < NFNS; i++)
        if (!strcmp(fns[i].name, name))
            return fns[i].p;
    abort();
}
#define CALL(type, name) ((type)F(#name))

static unsigned long long size_arg(const char *s)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    switch (*e) {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    }
    return v;
}

/* what we allocated, last first */
static unsigned long long ptrs[1 << 16];
static int nptr;
static CUstream stream;

static void out(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("%s%s\n", tag, buf);
    fflush(stdout);
}

struct thr {
    int dev;
    unsigned long long size;
    CUresult rc;
    CUmemGenericAllocationHandle h;
};
static void *thread_create(void *arg)
{
    struct thr *t = arg;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = t->dev;
    t->rc = CALL(PFN_cuMemCreate_v10020, cuMemCreate)(&t->h, t->size, &prop, 0);
    return NULL;
}

static void nvml(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        out("nvml unavailable");
        return;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*count)(unsigned *) = (nvmlReturn_t (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    unsigned n = 0;
    init();
    count(&n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        nvmlMemory_t m;
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        get(i, &d);
        nvmlReturn_t r1 = mem(d, &m), r2 = mem2(d, &m2);
        out("nvml %u rc=%d total=%llu used=%llu free=%llu", i, r1, m.total, m.used, m.free);
        out("nvml_v2 %u rc=%d total=%llu reserved=%llu used=%llu free=%llu", i, r2, m2.total,
            m2.reserved, m2.used, m2.free);
    }
}

/* every (name, version, flags) the runtime may ask, and what came back */
static void procaddr(void)
{
    int (*hook_count)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_hook_count");
    const char *(*hook_name)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "gpupool_hook_name");
    void *(*hook_wrapper)(int) = (void *(*)(int))dlsym(RTLD_DEFAULT, "gpupool_hook_wrapper");
    void *(*direct)(const char *) = (void *(*)(const char *))dlsym(libcuda, "fake_cuda_direct");
    static const struct {
        const char *sym;
        int ver;
        unsigned long long flags;
    } q[] = {
        {"cuGetProcAddress", 11030, 0}, {"cuGetProcAddress", 12000, 0},
        {"cuMemAlloc", 12000, 0},       {"cuMemAlloc", 3020, 0},
        {"cuMemAlloc", 2000, 0},        {"cuMemGetInfo", 12000, 0},
        {"cuMemFree", 12000, 0},        {"cuMemCreate", 12000, 0},
        {"cuMemRelease", 12000, 0},     {"cuMemAllocAsync", 12000, 0},
        {"cuMemAllocAsync", 12000, 2},  {"cuMemAllocAsync", 11000, 0},
        {"cuMemAllocFromPoolAsync", 12000, 2}, {"cuMemFreeAsync", 12000, 2},
        {"cuMemAllocManaged", 12000, 0}, {"cuMemAllocPitch", 12000, 0},
        {"cuDeviceTotalMem", 12000, 0}, {"cuArrayCreate", 12000, 0},
        {"cuArray3DCreate", 12000, 0},  {"cuArrayDestroy", 12000, 0},
        {"cuLaunchKernel", 12000, 0},   {"cuLaunchKernel", 12000, 2},
        {"cuLaunchKernel", 12000, 1},   {"cuLaunchKernelEx", 12000, 2},
        {"cuLaunchKernelEx", 11000, 0}, {"cuLaunchCooperativeKernel", 12000, 2},
        {"cuGraphLaunch", 12000, 0},    {"cuGraphLaunch", 12000, 2},
        {"cuInit", 12000, 0},           {"cuCtxGetDevice", 12000, 2},
        {"cuNoSuchFunction", 12000, 0},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        for (int v2 = 0; v2 < 2; v2++) {
            void *p = (void *)1;
            CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)77;
            CUresult rc = v2 ? gpa2(q[i].sym, &p, q[i].ver, q[i].flags, &st)
                             : gpa1(q[i].sym, &p, q[i].ver, q[i].flags);
            char what[128] = "null";
            if (p && p != (void *)1) {
                snprintf(what, sizeof what, "unknown");
                for (int k = 0; hook_count && k < hook_count(); k++)
                    if (hook_name(k) && hook_wrapper(k) == p)
                        snprintf(what, sizeof what, "wrapped:%s", hook_name(k));
                static const char *const reals[] = {"cuInit", "cuCtxGetDevice", "cuMemAlloc_v2",
                                                    "cuLaunchKernel", "cuMemAllocAsync_ptsz", 0};
                for (int k = 0; direct && reals[k]; k++)
                    if (direct(reals[k]) == p)
                        snprintf(what, sizeof what, "real:%s", reals[k]);
            }
            if (v2)
                out("proc_v2 %s %d %llu rc=%d status=%d %s", q[i].sym, q[i].ver, q[i].flags, rc, (int)st, what);
            else
                out("proc_v1 %s %d %llu rc=%d %s", q[i].sym, q[i].ver, q[i].flags, rc, what);
        }
    }
}

static void launch(int n)
{
    CUlaunchConfig cfg = {0};
    for (int i = 0; i < n; i++) {
        int rc = 0;
        rc |= CALL(PFN_cuLaunchKernel_v4000, cuLaunchKernel)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        rc |= CALL(PFN_cuLaunchKernel_v7000_ptsz, cuLaunchKernel_ptsz)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        rc |= CALL(PFN_cuLaunchCooperativeKernel_v9000, cuLaunchCooperativeKernel)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
        rc |= CALL(PFN_cuLaunchCooperativeKernel_v9000_ptsz, cuLaunchCooperativeKernel_ptsz)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
        rc |= CALL(PFN_cuLaunchKernelEx_v11060, cuLaunchKernelEx)(&cfg, NULL, NULL, NULL);
        rc |= CALL(PFN_cuLaunchKernelEx_v11060_ptsz, cuLaunchKernelEx_ptsz)(&cfg, NULL, NULL, NULL);
        rc |= CALL(PFN_cuGraphLaunch_v10000, cuGraphLaunch)(NULL, NULL);
        rc |= CALL(PFN_cuGraphLaunch_v10000_ptsz, cuGraphLaunch_ptsz)(NULL, NULL);
        if (rc) {
            out("launch rc=%d", rc);
            return;
        }
    }
    unsigned long long (*count)(int) = (unsigned long long (*)(int))dlsym(libcuda, "fake_cuda_launches");
    int (*times)(const unsigned long long **) = (int (*)(const unsigned long long **))dlsym(libcuda, "fake_cuda_launch_times");
    char buf[256] = "";
    for (int k = 0; k < 8; k++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " %llu", count(k));
    out("launch rc=0 counts%s", buf);
    const unsigned long long *t;
    int nt = times(&t);
    for (int i = 0; i < nt; i++)
        out("launch_time %llu", t[i]);
}

static int run(int argc, char **argv, int i);

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    via = argv[1];
    resolve();
    return run(argc, argv, 2);
}

static int run(int argc, char **argv, int i)
{
    for (; i < argc; i++) {
        char *c = argv[i];
        char *a = strchr(c, ':');
        char *b = a ? strchr(a + 1, ':') : NULL;
        char *d = b ? strchr(b + 1, ':') : NULL;
        unsigned long long x = a ? size_arg(a + 1) : 0, y = b ? size_arg(b + 1) : 0,
                           z = d ? size_arg(d + 1) : 0;
        CUresult rc;
        CUdeviceptr p = 0;
        if (!strcmp(c, "init")) {
            out("init rc=%d", CALL(PFN_cuInit_v2000, cuInit)(0));
        } else if (!strncmp(c, "ctx:", 4)) {
            CUcontext ctx;
            CALL(PFN_cuDevicePrimaryCtxRetain_v7000, cuDevicePrimaryCtxRetain)(&ctx, (int)x);
            rc = CALL(PFN_cuCtxSetCurrent_v4000, cuCtxSetCurrent)(ctx);
            CALL(PFN_cuStreamCreate_v2000, cuStreamCreate)(&stream, 0);
            out("ctx %llu rc=%d", x, rc);
        } else if (!strncmp(c, "alloc:", 6)) {
            rc = CALL(PFN_cuMemAlloc_v3020, cuMemAlloc_v2)(&p, x);
            if (!rc) ptrs[nptr++] = p;
            out("alloc rc=%d", rc);
        } else if (!strncmp(c, "managed:", 8)) {
            rc = CALL(PFN_cuMemAllocManaged_v6000, cuMemAllocManaged)(&p, x, CU_MEM_ATTACH_GLOBAL);
            if (!rc) ptrs[nptr++] = p;
            out("managed rc=%d", rc);
        } else if (!strncmp(c, "pitch:", 6)) {
            size_t pitch = 0;
            rc = CALL(PFN_cuMemAllocPitch_v3020, cuMemAllocPitch_v2)(&p, &pitch, x, y, 4);
            if (!rc) ptrs[nptr++] = p;
            out("pitch rc=%d pitch=%zu", rc, pitch);
        } else if (!strcmp(c, "free")) {
            out("free rc=%d", nptr ? CALL(PFN_cuMemFree_v3020, cuMemFree_v2)(ptrs[--nptr]) : -1);
        } else if (!strncmp(c, "create:", 7)) {
            struct thr t = {(int)x, y, 0, 0};
            thread_create(&t);
            if (!t.rc) ptrs[nptr++] = t.h;
            out("create rc=%d", t.rc);
        } else if (!strncmp(c, "thread_create:", 14)) {
            struct thr t = {(int)x, y, 0, 0};
            pthread_t th;
            pthread_create(&th, NULL, thread_create, &t);
            pthread_join(th, NULL);
            if (!t.rc) ptrs[nptr++] = t.h;
            out("thread_create rc=%d", t.rc);
        } else if (!strcmp(c, "release")) {
            out("release rc=%d", nptr ? CALL(PFN_cuMemRelease_v10020, cuMemRelease)(ptrs[--nptr]) : -1);
        } else if (!strncmp(c, "async:", 6) || !strncmp(c, "async_ptsz:", 11)) {
            int ptsz = c[5] == '_';
            rc = ptsz ? CALL(PFN_cuMemAllocAsync_v11020_ptsz, cuMemAllocAsync_ptsz)(&p, x, stream)
                      : CALL(PFN_cuMemAllocAsync_v11020, cuMemAllocAsync)(&p, x, stream);
            if (!rc) ptrs[nptr++] = p;
            out("%s rc=%d", ptsz ? "async_ptsz" : "async", rc);
        } else if (!strncmp(c, "pool:", 5) || !strncmp(c, "pool_ptsz:", 10)) {
            int ptsz = c[4] == '_';
            rc = ptsz ? CALL(PFN_cuMemAllocFromPoolAsync_v11020_ptsz, cuMemAllocFromPoolAsync_ptsz)(&p, x, NULL, stream)
                      : CALL(PFN_cuMemAllocFromPoolAsync_v11020, cuMemAllocFromPoolAsync)(&p, x, NULL, stream);
            if (!rc) ptrs[nptr++] = p;
            out("%s rc=%d", ptsz ? "pool_ptsz" : "pool", rc);
        } else if (!strcmp(c, "freeasync")) {
            out("freeasync rc=%d", nptr ? CALL(PFN_cuMemFreeAsync_v11020, cuMemFreeAsync)(ptrs[--nptr], stream) : -1);
        } else if (!strncmp(c, "array:", 6)) {
            CUDA_ARRAY_DESCRIPTOR desc = {.Width = x, .Height = y, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUarray arr = NULL;
            rc = CALL(PFN_cuArrayCreate_v3020, cuArrayCreate_v2)(&arr, &desc);
            if (!rc) ptrs[nptr++] = (uintptr_t)arr;
            out("array rc=%d", rc);
        } else if (!strncmp(c, "array3d:", 8)) {
            CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = x, .Height = y, .Depth = z, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUarray arr = NULL;
            rc = CALL(PFN_cuArray3DCreate_v3020, cuArray3DCreate_v2)(&arr, &desc);
            if (!rc) ptrs[nptr++] = (uintptr_t)arr;
            out("array3d rc=%d", rc);
        } else if (!strcmp(c, "arraydestroy")) {
            out("arraydestroy rc=%d", nptr ? CALL(PFN_cuArrayDestroy_v2000, cuArrayDestroy)((CUarray)(uintptr_t)ptrs[--nptr]) : -1);
        } else if (!strncmp(c, "mipmap:", 7)) {
            CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = x, .Height = y, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUmipmappedArray arr = NULL;
            rc = CALL(PFN_cuMipmappedArrayCreate_v5000, cuMipmappedArrayCreate)(&arr, &desc, (unsigned)z);
            if (!rc) ptrs[nptr++] = (uintptr_t)arr;
            out("mipmap rc=%d", rc);
        } else if (!strcmp(c, "mipmapdestroy")) {
            out("mipmapdestroy rc=%d", nptr ? CALL(PFN_cuMipmappedArrayDestroy_v5000, cuMipmappedArrayDestroy)((CUmipmappedArray)(uintptr_t)ptrs[--nptr]) : -1);
        } else if (!strcmp(c, "info")) {
            size_t f = 0, t = 0;
            rc = CALL(PFN_cuMemGetInfo_v3020, cuMemGetInfo_v2)(&f, &t);
            out("info rc=%d free=%zu total=%zu", rc, f, t);
        } else if (!strncmp(c, "total:", 6)) {
            size_t t = 0;
            rc = CALL(PFN_cuDeviceTotalMem_v3020, cuDeviceTotalMem_v2)(&t, (int)x);
            out("total rc=%d total=%zu", rc, t);
        } else if (!strncmp(c, "fill:", 5)) {
            int n = 0;
            while (n < 100000 && CALL(PFN_cuMemAlloc_v3020, cuMemAlloc_v2)(&p, x) == CUDA_SUCCESS) {
                ptrs[nptr++] = p;
                n++;
            }
            out("fill n=%d", n);
        } else if (!strncmp(c, "launch:", 7)) {
            launch((int)x);
        } else if (!strcmp(c, "nvml")) {
            nvml();
        } else if (!strcmp(c, "procaddr")) {
            procaddr();
        } else if (!strncmp(c, "touch:", 6)) {
            FILE *f = fopen(a + 1, "w");
            if (f) fclose(f);
        } else if (!strncmp(c, "wait_file:", 10)) {
            struct stat st;
            while (stat(a + 1, &st) != 0)
                usleep(1000);
        } else if (!strncmp(c, "sleep:", 6)) {
            usleep((useconds_t)x * 1000);
        } else if (!strcmp(c, "hold")) {
            out("holding");
            for (;;)
                pause();
        } else if (!strcmp(c, "exit")) {
            _exit(0);
        } else if (!strcmp(c, "fork")) {
            int j = i + 1;
            while (j < argc && strcmp(argv[j], "join"))
                j++;
            pid_t pid = fork();
            if (pid == 0) {
                tag = "child ";
                argv[j < argc ? j : argc - 1] = "exit";
                return run(j < argc ? j + 1 : argc, argv, i + 1);
            }
            int status;
            waitpid(pid, &status, 0);
            out("joined status=%d", WEXITSTATUS(status));
            i = j;
        } else {
            fprintf(stderr, "probe: unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
