/* overhead: the cost gpupool adds per cuMemAlloc_v2+cuMemFree_v2 pair and per
 * cuLaunchKernel, measured in one run against the fake driver: the same calls made through
 * the hooks (dlsym -> our wrappers, memory limit on) and directly into the fake (its own
 * pointers, from fake_cuda_direct). Prints one JSON object. Run with LD_PRELOAD set. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda.h>
#include <cudaTypedefs.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double alloc_pairs(PFN_cuMemAlloc_v3020 a, PFN_cuMemFree_v3020 f, int n)
{
    CUdeviceptr p;
    double t = now();
    for (int i = 0; i < n; i++)
        if (a(&p, 4096) || f(p))
            abort();
    return (now() - t) / n;
}

static double launches(PFN_cuLaunchKernel_v4000 l, int n)
{
    double t = now();
    for (int i = 0; i < n; i++)
        if (l(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))
            abort();
    return (now() - t) / n;
}

static double best(double x, double y) { return x < y ? x : y; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    void *(*direct)(const char *) = (void *(*)(const char *))dlsym(h, "fake_cuda_direct");
    if (!h || !direct || !dlsym(RTLD_DEFAULT, "gpupool_hook_count")) {
        fprintf(stderr, "needs the fake driver and LD_PRELOAD of libgpupool-cuda.so\n");
        return 2;
    }
    PFN_cuMemAlloc_v3020 ha = (PFN_cuMemAlloc_v3020)dlsym(h, "cuMemAlloc_v2");
    PFN_cuMemFree_v3020 hf = (PFN_cuMemFree_v3020)dlsym(h, "cuMemFree_v2");
    PFN_cuLaunchKernel_v4000 hl = (PFN_cuLaunchKernel_v4000)dlsym(h, "cuLaunchKernel");
    PFN_cuMemAlloc_v3020 da = (PFN_cuMemAlloc_v3020)direct("cuMemAlloc_v2");
    PFN_cuMemFree_v3020 df = (PFN_cuMemFree_v3020)direct("cuMemFree_v2");
    PFN_cuLaunchKernel_v4000 dl = (PFN_cuLaunchKernel_v4000)direct("cuLaunchKernel");
    if (ha == da || hl == dl) {
        fprintf(stderr, "the hooks are not in place\n");
        return 2;
    }
    ((CUresult(*)(unsigned))dlsym(h, "cuInit"))(0);
    CUcontext ctx;
    ((CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    ((CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent"))(ctx);

    /* interleaved rounds, best of each: noise on a shared machine only ever adds time */
    double a_h = 1e30, a_d = 1e30, l_h = 1e30, l_d = 1e30;
    alloc_pairs(ha, hf, n / 10);
    for (int r = 0; r < 7; r++) {
        a_d = best(a_d, alloc_pairs(da, df, n));
        a_h = best(a_h, alloc_pairs(ha, hf, n));
        l_d = best(l_d, launches(dl, n * 5));
        l_h = best(l_h, launches(hl, n * 5));
    }
    printf("{\"alloc_pair_direct_ns\": %.1f, \"alloc_pair_hooked_ns\": %.1f, "
           "\"alloc_pair_added_ns\": %.1f, \"launch_direct_ns\": %.2f, \"launch_hooked_ns\": %.2f, "
           "\"launch_added_ns\": %.2f, \"iterations\": %d}\n",
           a_d, a_h, a_h - a_d, l_d, l_h, l_h - l_d, n);
    return 0;
}
