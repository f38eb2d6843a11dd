/* Launches: pass-through, or held to the compute share. The share is an admission window
 * on the system-wide monotonic clock: in every period of GPUPOOL_COMPUTE_PERIOD_MS, kernels
 * may be launched during the first GPUPOOL_COMPUTE_SHARE percent. Every process of the
 * container sees the same clock, so the window is common to all of them without shared
 * state, and a killed process holds nothing. Work already queued runs on past the window;
 * the share is exact for loops that synchronise each step (training steps do). */

#include <time.h>

#include "gpupool.h"

int gp_compute_on;

void gp_compute_wait(void)
{
    const struct gp_config *c = &gp_cfg;
    uint64_t period = c->compute_period_ns;
    uint64_t open_ns = period / 100 * c->compute_share;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        uint64_t phase = now % period;
        if (phase < open_ns)
            return;
        uint64_t next = now - phase + period;
        ts.tv_sec = (time_t)(next / 1000000000ull);
        ts.tv_nsec = (long)(next % 1000000000ull);
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
}

static inline void gate(void)
{
    gp_config_load();
    gp_activity_launch();
    if (GP_UNLIKELY(gp_compute_on))
        gp_compute_wait();
}

#define GP_LAUNCH_KERNEL(sym)                                                                 \
    CUresult CUDAAPI gp_w_##sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                                unsigned int bx, unsigned int by, unsigned int bz,            \
                                unsigned int shmem, CUstream s, void **params, void **extra)  \
    {                                                                                         \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                                   \
        gate();                                                                               \
        return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);                      \
    }
GP_LAUNCH_KERNEL(cuLaunchKernel)
GP_LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define GP_LAUNCH_COOP(sym)                                                                   \
    CUresult CUDAAPI gp_w_##sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                                unsigned int bx, unsigned int by, unsigned int bz,            \
                                unsigned int shmem, CUstream s, void **params)                \
    {                                                                                         \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                                   \
        gate();                                                                               \
        return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);                             \
    }
GP_LAUNCH_COOP(cuLaunchCooperativeKernel)
GP_LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define GP_LAUNCH_EX(sym)                                                                     \
    CUresult CUDAAPI gp_w_##sym(const CUlaunchConfig *config, CUfunction f, void **params,    \
                                void **extra)                                                 \
    {                                                                                         \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                                   \
        gate();                                                                               \
        return real(config, f, params, extra);                                                \
    }
GP_LAUNCH_EX(cuLaunchKernelEx)
GP_LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define GP_GRAPH_LAUNCH(sym)                                                                  \
    CUresult CUDAAPI gp_w_##sym(CUgraphExec g, CUstream s)                                    \
    {                                                                                         \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                                   \
        gate();                                                                               \
        return real(g, s);                                                                    \
    }
GP_GRAPH_LAUNCH(cuGraphLaunch)
GP_GRAPH_LAUNCH(cuGraphLaunch_ptsz)
