/* gpupool CUDA interception library: internal interfaces shared by the source files. */
#ifndef GPUPOOL_H
#define GPUPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <nvml.h>

#define GP_EXPORT __attribute__((visibility("default")))
#define GP_LIKELY(x) __builtin_expect(!!(x), 1)
#define GP_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define GP_MAX_DEV 64
#define GP_UNLIMITED UINT64_MAX

/* NVML entry points have no typedef header: ours. */
typedef nvmlReturn_t (*gp_pfn_nvml_meminfo)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*gp_pfn_nvml_meminfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*gp_pfn_nvml_index)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*gp_pfn_nvml_uuid)(nvmlDevice_t, char *, unsigned int);

/* ---- hooks.c: the table generated from hooks.def ---- */
enum gp_lib { GP_LIB_CU, GP_LIB_NVML };

enum gp_hook_id {
#define GP_HOOK(lib, sym, base, ver, ptsz, pfn) GP_H_##sym,
#define GP_REAL(lib, sym, pfn) GP_H_##sym,
#include "hooks.def"
    GP_H_COUNT
};

/* one pointer type per row, and the exported wrapper of every GP_HOOK row */
#define GP_HOOK(lib, sym, base, ver, ptsz, pfn) \
    typedef pfn gp_pfn_##sym;                   \
    extern __typeof__(*(pfn)0) gp_w_##sym __asm__(#sym) GP_EXPORT;
#define GP_REAL(lib, sym, pfn) typedef pfn gp_pfn_##sym;
#include "hooks.def"

extern void *gp_real_table[GP_H_COUNT];
void gp_load_lib(enum gp_lib lib);        /* resolves the real functions once */
void *gp_real_get(enum gp_hook_id id);    /* NULL when the real library lacks it */
int gp_hook_find(const char *name);       /* GP_HOOK rows only; -1 if not hooked */
void *gp_hook_wrapper(int id);
/* cuGetProcAddress: the pointer to hand back for what the driver returned */
void *gp_procaddr_wrap(const char *symbol, void *real, int cuda_version, cuuint64_t flags);

/* Fetch the real function for `sym` into `var`, or return `err` (never call NULL). */
#define GP_REAL_OR_RETURN(var, sym, err)                               \
    gp_pfn_##sym var = (gp_pfn_##sym)gp_real_get(GP_H_##sym);          \
    if (GP_UNLIKELY(var == NULL)) return (err)

/* ---- config.c: the environment the scheduler sets ---- */
enum gp_mode {
    GP_MODE_OFF = 0,    /* no memory limit: memory calls pass through untouched */
    GP_MODE_LIMIT = 1,  /* limits enforced */
    GP_MODE_REFUSE = 2, /* bad configuration: refuse every allocation */
};
enum gp_log_level { GP_LOG_ERROR = 0, GP_LOG_WARN = 1, GP_LOG_INFO = 2, GP_LOG_DEBUG = 3 };

struct gp_config {
    enum gp_mode mode;
    int log_level;
    uint64_t limit[GP_MAX_DEV]; /* GP_UNLIMITED where none */
    unsigned compute_share;     /* percent; 0 or 100 = off */
    uint64_t compute_period_ns;
    uint64_t reap_interval_ns;
    char region_path[512];
};
extern struct gp_config gp_cfg;
void gp_config_load(void);              /* once; cheap afterwards */
static inline const struct gp_config *gp_config(void) { gp_config_load(); return &gp_cfg; }
uint64_t gp_limit(int dev);             /* GP_UNLIMITED, or the cap for CUDA ordinal dev */
void gp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- account.c: the per-container shared account ---- */
int gp_account_reserve(int dev, uint64_t bytes);  /* 0, or -1: over the limit (nothing changed) */
void gp_account_release(int dev, uint64_t bytes);
void gp_account_adjust(int dev, int64_t delta);   /* no limit check (pitch rounding) */
uint64_t gp_account_used(int dev);                /* whole container, after reaping the dead */
void gp_activity_launch(void);                    /* counts a launch in the shared account */

enum gp_track_kind { GP_TRACK_PTR = 1, GP_TRACK_HANDLE = 2, GP_TRACK_ARRAY = 3, GP_TRACK_MIPMAP = 4 };
int gp_track_add(uint64_t key, int kind, int dev, uint64_t bytes);
int gp_track_take(uint64_t key, int kind, int *dev, uint64_t *bytes); /* 0 if found (removed) */

/* ---- ctx.c: which device an allocation lands on ---- */
int gp_current_device(int *dev);                   /* 0 or -1 (no current context) */
int gp_stream_device(CUstream stream, int *dev);

/* ---- launch.c: compute share ---- */
extern int gp_compute_on;
void gp_compute_wait(void);



/* ---- dl.c: the loader's own dlsym/dlvsym, found without going through ours ---- */
void *gp_real_dlsym(void *handle, const char *name);
void *gp_real_dlvsym(void *handle, const char *name, const char *version);
#endif
