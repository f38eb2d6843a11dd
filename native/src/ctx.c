/* Contexts: which device an allocation lands on. */
#include "gpupool.h"

int gp_current_device(int *dev)
{
    gp_pfn_cuCtxGetDevice get = (gp_pfn_cuCtxGetDevice)gp_real_get(GP_H_cuCtxGetDevice);
    CUdevice d;
    if (!get || get(&d) != CUDA_SUCCESS)
        return -1;
    *dev = (int)d;
    return 0;
}

/* the device of a stream's context; the current one for the default streams */
int gp_stream_device(CUstream stream, int *dev)
{
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return gp_current_device(dev);
    gp_pfn_cuStreamGetCtx sctx = (gp_pfn_cuStreamGetCtx)gp_real_get(GP_H_cuStreamGetCtx);
    gp_pfn_cuCtxGetCurrent cur = (gp_pfn_cuCtxGetCurrent)gp_real_get(GP_H_cuCtxGetCurrent);
    gp_pfn_cuCtxPushCurrent_v2 push =
        (gp_pfn_cuCtxPushCurrent_v2)gp_real_get(GP_H_cuCtxPushCurrent_v2);
    gp_pfn_cuCtxPopCurrent_v2 pop = (gp_pfn_cuCtxPopCurrent_v2)gp_real_get(GP_H_cuCtxPopCurrent_v2);
    CUcontext sc = NULL, cc = NULL;
    if (!sctx || !cur || sctx(stream, &sc) != CUDA_SUCCESS || sc == NULL)
        return gp_current_device(dev);
    if (cur(&cc) == CUDA_SUCCESS && cc == sc)
        return gp_current_device(dev);
    /* another context's stream (or no current context, as on an allocator thread) */
    if (!push || !pop || push(sc) != CUDA_SUCCESS)
        return -1;
    int rc = gp_current_device(dev);
    CUcontext popped;
    pop(&popped);
    return rc;
}
