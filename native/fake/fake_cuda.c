/* A fake libcuda.so.1 for tests and the benchmark: no GPU, just bookkeeping that looks
 * like the driver from the outside. Devices: FAKE_CUDA_DEVICES (default 2), each with
 * FAKE_CUDA_MEM bytes (default 80 GiB) of "physical" memory, per process. Contexts are
 * per thread, as in the driver. cuGetProcAddress answers by base name, version and flags
 * like the real one; FAKE_CUDA_PROC_LOG appends every request to a file, and
 * FAKE_CUDA_STUB_UNKNOWN=1 answers unknown names with a stub (so libcudart goes on). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#undef cuGetProcAddress /* we define both the 11.3 and the 12.0 entry points */

#define MAXDEV 8
#define MAXCTX 64

struct fake_ctx {
    int dev;
};
struct fake_stream {
    struct fake_ctx *ctx;
};

static int ndev = -1;
static unsigned long long phys_mem;
static unsigned long long dev_used[MAXDEV];
static struct fake_ctx primary[MAXDEV];
static struct fake_ctx created[MAXCTX];
static int ncreated;
static __thread struct fake_ctx *stack[16];
static __thread int depth; /* stack[depth-1] is current */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void setup(void)
{
    if (ndev >= 0)
        return;
    const char *v = getenv("FAKE_CUDA_DEVICES");
    int n = v ? atoi(v) : 2;
    v = getenv("FAKE_CUDA_MEM");
    phys_mem = v ? strtoull(v, NULL, 10) : 80ull << 30;
    for (int i = 0; i < MAXDEV; i++)
        primary[i].dev = i;
    ndev = n < 0 ? 0 : n > MAXDEV ? MAXDEV : n;
}

static struct fake_ctx *current(void) { return depth ? stack[depth - 1] : NULL; }

/* ---- allocations: address -> (device, size) ---- */
struct rec {
    unsigned long long key, size;
    int dev, used;
};
#define RECS (1 << 16)
static struct rec recs[RECS];
static unsigned long long next_addr = 0x7f0000000000ull;

static int rec_add(unsigned long long key, int dev, unsigned long long size)
{
    for (unsigned i = (unsigned)(key >> 8) & (RECS - 1), n = 0; n < RECS; n++, i = (i + 1) & (RECS - 1))
        if (recs[i].used != 1) { /* empty or a tombstone */
            recs[i] = (struct rec){key, size, dev, 1};
            return 0;
        }
    return -1;
}

static struct rec *rec_find(unsigned long long key)
{
    for (unsigned i = (unsigned)(key >> 8) & (RECS - 1), n = 0; n < RECS; n++, i = (i + 1) & (RECS - 1)) {
        if (recs[i].used == 1 && recs[i].key == key)
            return &recs[i];
        if (!recs[i].used)
            return NULL;
    }
    return NULL;
}

static CUresult fake_alloc(int dev, unsigned long long size, unsigned long long *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    const char *slow = getenv("FAKE_CUDA_ALLOC_SLEEP_MS");
    if (slow) {
        const char *mark = getenv("FAKE_CUDA_ALLOC_MARK");
        if (mark) {
            FILE *f = fopen(mark, "w");
            if (f)
                fclose(f);
        }
        usleep((useconds_t)atoi(slow) * 1000);
    }
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    if (dev_used[dev] + size > phys_mem) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        unsigned long long a = next_addr;
        next_addr += (size + 0xfff) & ~0xfffull;
        if (rec_add(a, dev, size) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            dev_used[dev] += size;
            *out = a;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult fake_free(unsigned long long key)
{
    pthread_mutex_lock(&mu);
    struct rec *r = rec_find(key);
    if (r) {
        dev_used[r->dev] -= r->size;
        r->used = 2; /* tombstone */
    }
    pthread_mutex_unlock(&mu);
    return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult ctx_dev(int *dev)
{
    struct fake_ctx *c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

static CUresult stream_dev(CUstream s, int *dev)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return ctx_dev(dev);
    *dev = ((struct fake_stream *)s)->ctx->dev;
    return CUDA_SUCCESS;
}

/* ---- the driver API ---- */
CUresult cuInit(unsigned int flags) { setup(); return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { setup(); *n = ndev; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    setup();
    if (ordinal < 0 || ordinal >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    setup();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = phys_mem;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    setup();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *c = (CUcontext)&primary[d];
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext c)
{
    if (!c) {
        if (depth)
            depth--;
        return CUDA_SUCCESS;
    }
    if (depth)
        stack[depth - 1] = (struct fake_ctx *)c;
    else
        stack[depth++] = (struct fake_ctx *)c;
    return CUDA_SUCCESS;
}
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d)
{
    setup();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    struct fake_ctx *c = ncreated < MAXCTX ? &created[ncreated++] : NULL;
    pthread_mutex_unlock(&mu);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = d;
    if (depth < 16)
        stack[depth++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)current(); return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d)
{
    int dev;
    CUresult r = ctx_dev(&dev);
    if (r == CUDA_SUCCESS)
        *d = dev;
    return r;
}
CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    if (!c || depth >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    stack[depth++] = (struct fake_ctx *)c;
    return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    if (!depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    depth--;
    if (c)
        *c = (CUcontext)stack[depth];
    return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    struct fake_ctx *c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_stream *st = malloc(sizeof *st);
    st->ctx = c;
    *s = (CUstream)st;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        *c = (CUcontext)current();
        return *c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    *c = (CUcontext)((struct fake_stream *)s)->ctx;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *c) { return cuStreamGetCtx(s, c); }

CUresult cuMemGetInfo_v2(size_t *freep, size_t *total)
{
    int dev;
    CUresult r = ctx_dev(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&mu);
    *freep = phys_mem - dev_used[dev];
    *total = phys_mem;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    int dev;
    CUresult r = ctx_dev(&dev);
    unsigned long long a = 0;
    if (r == CUDA_SUCCESS && (r = fake_alloc(dev, size, &a)) == CUDA_SUCCESS)
        *p = a;
    return r;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    return cuMemAlloc_v2(p, size);
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    int dev;
    CUresult r = ctx_dev(&dev);
    size_t pt = (w + 511) & ~(size_t)511;
    unsigned long long a = 0;
    if (r == CUDA_SUCCESS && (r = fake_alloc(dev, (unsigned long long)pt * h, &a)) == CUDA_SUCCESS) {
        *p = a;
        *pitch = pt;
    }
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return fake_free(p); }

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    setup();
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    unsigned long long a = 0;
    CUresult r = fake_alloc(prop->location.id, size, &a); /* no context needed, like the driver */
    if (r == CUDA_SUCCESS)
        *h = a;
    return r;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fake_free(h); }

#define ASYNC(sym)                                                             \
    CUresult sym(CUdeviceptr *p, size_t size, CUstream s)                      \
    {                                                                          \
        int dev;                                                               \
        CUresult r = stream_dev(s, &dev);                                      \
        unsigned long long a = 0;                                              \
        if (r == CUDA_SUCCESS && (r = fake_alloc(dev, size, &a)) == CUDA_SUCCESS) \
            *p = a;                                                            \
        return r;                                                              \
    }
ASYNC(cuMemAllocAsync)
ASYNC(cuMemAllocAsync_ptsz)
#define POOL(sym)                                                              \
    CUresult sym(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s)   \
    {                                                                          \
        return cuMemAllocAsync(p, size, s);                                    \
    }
POOL(cuMemAllocFromPoolAsync)
POOL(cuMemAllocFromPoolAsync_ptsz)
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return fake_free(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return fake_free(p); }

static CUresult array_alloc(unsigned long long bytes, void **out)
{
    int dev;
    CUresult r = ctx_dev(&dev);
    unsigned long long a = 0;
    if (r == CUDA_SUCCESS && (r = fake_alloc(dev, bytes, &a)) == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)a;
    return r;
}
CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    return array_alloc((unsigned long long)d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 4,
                       (void **)a);
}
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return array_alloc((unsigned long long)d->Width * (d->Height ? d->Height : 1) *
                           (d->Depth ? d->Depth : 1) * d->NumChannels * 4,
                       (void **)a);
}
CUresult cuArrayDestroy(CUarray a) { return fake_free((uintptr_t)a); }
CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int n)
{
    return array_alloc((unsigned long long)d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 8,
                       (void **)a);
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return fake_free((uintptr_t)a); }

/* ---- launches: counted, with the monotonic time of each (for the compute-share test) ---- */
#define MAXLAUNCH 100000
static unsigned long long launch_ns[MAXLAUNCH];
static int nlaunch;
static unsigned long long launches[8];

static CUresult launched(int kind)
{
    __atomic_fetch_add(&launches[kind], 1, __ATOMIC_RELAXED);
    if (getenv("FAKE_CUDA_LAUNCH_TIMES")) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int i = __atomic_fetch_add(&nlaunch, 1, __ATOMIC_RELAXED);
        if (i < MAXLAUNCH)
            launch_ns[i] = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    }
    return CUDA_SUCCESS;
}
#define LAUNCH_ARGS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                    unsigned bz, unsigned sh, CUstream s, void **params
CUresult cuLaunchKernel(LAUNCH_ARGS, void **extra) { return launched(0); }
CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **extra) { return launched(1); }
CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS) { return launched(2); }
CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS) { return launched(3); }
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return launched(4); }
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return launched(5); }
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return launched(6); }
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return launched(7); }

/* test-only accessors (not driver API) */
unsigned long long fake_cuda_launches(int kind) { return launches[kind & 7]; }
int fake_cuda_launch_times(const unsigned long long **times)
{
    *times = launch_ns;
    return nlaunch < MAXLAUNCH ? nlaunch : MAXLAUNCH;
}
unsigned long long fake_cuda_used(int dev) { return dev_used[dev]; }

CUresult cuGetExportTable(const void **table, const CUuuid *id) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "fake"; return CUDA_SUCCESS; }

/* ---- cuGetProcAddress ---- */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

static CUresult stub(void) { return CUDA_ERROR_NOT_SUPPORTED; }

struct entry {
    const char *base;
    int version;
    int ptsz;
    void *fn;
    const char *name;
};
#define E(base, ver, ptsz, fn) {#base, ver, ptsz, (void *)&fn, #fn}
static const struct entry table[] = {
    E(cuInit, 2000, 0, cuInit),
    E(cuDriverGetVersion, 2020, 0, cuDriverGetVersion),
    E(cuDeviceGet, 2000, 0, cuDeviceGet),
    E(cuDeviceGetCount, 2000, 0, cuDeviceGetCount),
    E(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2),
    E(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain),
    E(cuCtxCreate, 3020, 0, cuCtxCreate_v2),
    E(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent),
    E(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent),
    E(cuCtxGetDevice, 2000, 0, cuCtxGetDevice),
    E(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2),
    E(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2),
    E(cuStreamCreate, 2000, 0, cuStreamCreate),
    E(cuStreamGetCtx, 9020, 0, cuStreamGetCtx),
    E(cuStreamGetCtx, 9020, 1, cuStreamGetCtx_ptsz),
    E(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2),
    E(cuMemAlloc, 3020, 0, cuMemAlloc_v2),
    E(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2),
    E(cuMemAllocManaged, 6000, 0, cuMemAllocManaged),
    E(cuMemFree, 3020, 0, cuMemFree_v2),
    E(cuMemCreate, 10020, 0, cuMemCreate),
    E(cuMemRelease, 10020, 0, cuMemRelease),
    E(cuMemAllocAsync, 11020, 0, cuMemAllocAsync),
    E(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    E(cuMemFreeAsync, 11020, 0, cuMemFreeAsync),
    E(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz),
    E(cuArrayCreate, 3020, 0, cuArrayCreate_v2),
    E(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2),
    E(cuArrayDestroy, 2000, 0, cuArrayDestroy),
    E(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate),
    E(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy),
    E(cuLaunchKernel, 4000, 0, cuLaunchKernel),
    E(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz),
    E(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel),
    E(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz),
    E(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx),
    E(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz),
    E(cuGraphLaunch, 10000, 0, cuGraphLaunch),
    E(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz),
    E(cuGetProcAddress, 11030, 0, cuGetProcAddress),
    E(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2),
    E(cuGetExportTable, 3000, 0, cuGetExportTable),
    E(cuGetErrorString, 6000, 0, cuGetErrorString),
};
#define NTABLE (sizeof table / sizeof table[0])

/* the driver's own pointer for an exported name (the benchmark's direct calls) */
void *fake_cuda_direct(const char *name)
{
    for (size_t i = 0; i < NTABLE; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].fn;
    return NULL;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    const char *log = getenv("FAKE_CUDA_PROC_LOG");
    if (log) {
        FILE *f = fopen(log, "a");
        if (f) {
            fprintf(f, "%s %d %llu\n", symbol, cudaVersion, (unsigned long long)flags);
            fclose(f);
        }
    }
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct entry *best = NULL;
    int known = 0;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (size_t i = 0; i < NTABLE; i++) {
            const struct entry *e = &table[i];
            if (strcmp(e->base, symbol) != 0)
                continue;
            known = 1;
            if (e->version > cudaVersion || (pass == 0 && e->ptsz != want_ptsz))
                continue;
            if (!best || e->version > best->version)
                best = e;
        }
    if (best) {
        *pfn = best->fn;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (!known && getenv("FAKE_CUDA_STUB_UNKNOWN")) {
        *pfn = (void *)&stub;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (status)
        *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
