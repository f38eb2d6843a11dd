/* The hook table generated from hooks.def: names, wrappers, real functions, and the
 * cuGetProcAddress dispatch. */

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "gpupool.h"

struct gp_row {
    const char *name;
    const char *base;
    int version;
    int ptsz;
    enum gp_lib lib;
    void *wrapper; /* NULL for GP_REAL rows */
};

static const struct gp_row rows[GP_H_COUNT] = {
#define GP_HOOK(lib, sym, base, ver, ptsz, pfn) \
    [GP_H_##sym] = {#sym, #base, ver, ptsz, GP_LIB_##lib, (void *)&gp_w_##sym},
#define GP_REAL(lib, sym, pfn) [GP_H_##sym] = {#sym, #sym, 0, 0, GP_LIB_##lib, NULL},
#include "hooks.def"
};

void *gp_real_table[GP_H_COUNT];

static const char *const lib_names[2][3] = {
    [GP_LIB_CU] = {"libcuda.so.1", "libcuda.so", NULL},
    [GP_LIB_NVML] = {"libnvidia-ml.so.1", "libnvidia-ml.so", NULL},
};
static pthread_once_t lib_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void load(enum gp_lib lib)
{
    void *h = NULL;
    for (int i = 0; !h && lib_names[lib][i]; i++)
        h = dlopen(lib_names[lib][i], RTLD_NOW | RTLD_NOLOAD);
    for (int i = 0; !h && lib_names[lib][i]; i++)
        h = dlopen(lib_names[lib][i], RTLD_NOW);
    if (!h) {
        gp_log(GP_LOG_WARN, "cannot load %s: hooked calls will fail", lib_names[lib][0]);
        return;
    }
    for (int i = 0; i < GP_H_COUNT; i++)
        if (rows[i].lib == lib)
            __atomic_store_n(&gp_real_table[i], gp_real_dlsym(h, rows[i].name), __ATOMIC_RELEASE);
}
static void load_cu(void) { load(GP_LIB_CU); }
static void load_nvml(void) { load(GP_LIB_NVML); }

void gp_load_lib(enum gp_lib lib)
{
    pthread_once(&lib_once[lib], lib == GP_LIB_CU ? load_cu : load_nvml);
}

void *gp_real_get(enum gp_hook_id id)
{
    void *p = __atomic_load_n(&gp_real_table[id], __ATOMIC_ACQUIRE);
    if (GP_LIKELY(p != NULL))
        return p;
    gp_load_lib(rows[id].lib);
    return __atomic_load_n(&gp_real_table[id], __ATOMIC_ACQUIRE);
}

int gp_hook_find(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < GP_H_COUNT; i++)
        if (rows[i].wrapper && strcmp(rows[i].name, name) == 0)
            return i;
    return -1;
}

void *gp_hook_wrapper(int id) { return (id >= 0 && id < GP_H_COUNT) ? rows[id].wrapper : NULL; }

/* Which row the driver answered for (symbol, version, flags): first by the pointer it
 * returned (it equals the exported function in every driver we know), then by name:
 * the row with that base name, the requested stream flavour and the highest version
 * not above cudaVersion. */
static int procaddr_row(const char *symbol, void *real, int cuda_version, cuuint64_t flags)
{
    gp_load_lib(GP_LIB_CU);
    for (int i = 0; i < GP_H_COUNT; i++)
        if (rows[i].wrapper && rows[i].lib == GP_LIB_CU &&
            __atomic_load_n(&gp_real_table[i], __ATOMIC_ACQUIRE) == real)
            return i;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        for (int i = 0; i < GP_H_COUNT; i++) {
            const struct gp_row *r = &rows[i];
            if (!r->wrapper || r->lib != GP_LIB_CU || strcmp(r->base, symbol) != 0)
                continue;
            if (r->version > cuda_version)
                continue;
            /* pass 0: the flavour asked for; pass 1: a symbol with only one flavour */
            if (pass == 0 && r->ptsz != want_ptsz)
                continue;
            if (best < 0 || r->version > rows[best].version)
                best = i;
        }
    }
    return best;
}

void *gp_procaddr_wrap(const char *symbol, void *real, int cuda_version, cuuint64_t flags)
{
    if (!symbol || !real)
        return real;
    gp_config_load();
    int id = procaddr_row(symbol, real, cuda_version, flags);
    if (id >= 0) {
        void *expect = NULL;
        /* the driver's pointer is the real function of that row */
        __atomic_compare_exchange_n(&gp_real_table[id], &expect, real, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    gp_log(GP_LOG_DEBUG, "getproc %s %d %llu -> %s", symbol, cuda_version,
           (unsigned long long)flags, id >= 0 ? rows[id].name : "real");
    return id >= 0 ? rows[id].wrapper : real;
}

/* cuGetProcAddress (4 arguments, CUDA 11.3) and _v2 (5 arguments, CUDA 12): the driver
 * answers; we only swap the pointer where we hook. symbolStatus passes through as is. */
CUresult CUDAAPI gp_w_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags)
{
    GP_REAL_OR_RETURN(real, cuGetProcAddress, CUDA_ERROR_NOT_FOUND);
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = gp_procaddr_wrap(symbol, *pfn, cudaVersion, flags);
    return r;
}

CUresult CUDAAPI gp_w_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                          cuuint64_t flags,
                                          CUdriverProcAddressQueryResult *symbolStatus)
{
    GP_REAL_OR_RETURN(real, cuGetProcAddress_v2, CUDA_ERROR_NOT_FOUND);
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = gp_procaddr_wrap(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* For the consistency test: the table as the library sees it. */
GP_EXPORT int gpupool_hook_count(void) { return GP_H_COUNT; }
GP_EXPORT const char *gpupool_hook_name(int i)
{
    return (i >= 0 && i < GP_H_COUNT && rows[i].wrapper) ? rows[i].name : NULL;
}
GP_EXPORT void *gpupool_hook_wrapper(int i) { return gp_hook_wrapper(i); }
