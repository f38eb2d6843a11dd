/* Driver memory: every allocation path reserves in the shared account before the driver
 * is called and gives the reservation back when the driver fails; frees give it back.
 * Memory queries report total = min(limit, physical) and free never below zero. */
#include "gpupool.h"

static int limited(void) { return gp_config()->mode != GP_MODE_OFF; }

/* Reserve, call, roll back on failure. `call` is the driver call written inline. */
#define GP_COUNTED_ALLOC(dev, bytes, call, key_expr, kind)                      \
    do {                                                                        \
        if (gp_account_reserve((dev), (bytes)) != 0)                            \
            return CUDA_ERROR_OUT_OF_MEMORY;                                    \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            gp_account_release((dev), (bytes));                                 \
            return r_;                                                          \
        }                                                                       \
        if (gp_limit(dev) != GP_UNLIMITED)                                      \
            gp_track_add((uint64_t)(key_expr), (kind), (dev), (bytes));         \
        return r_;                                                              \
    } while (0)

/* Take the record first (so a concurrent allocation of the same address cannot be
 * mistaken for it), free, and put it back if the driver refuses. */
#define GP_COUNTED_FREE(key, kind, call)                                        \
    do {                                                                        \
        int dev_;                                                               \
        uint64_t bytes_;                                                        \
        int had_ = gp_track_take((uint64_t)(key), (kind), &dev_, &bytes_) == 0; \
        CUresult r_ = (call);                                                   \
        if (had_) {                                                             \
            if (r_ == CUDA_SUCCESS)                                             \
                gp_account_release(dev_, bytes_);                               \
            else                                                                \
                gp_track_add((uint64_t)(key), (kind), dev_, bytes_);            \
        }                                                                       \
        return r_;                                                              \
    } while (0)

CUresult CUDAAPI gp_w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    GP_REAL_OR_RETURN(real, cuMemAlloc_v2, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || gp_current_device(&dev) != 0)
        return real(dptr, bytesize); /* no context: the driver says so */
    GP_COUNTED_ALLOC(dev, bytesize, real(dptr, bytesize), *dptr, GP_TRACK_PTR);
}

CUresult CUDAAPI gp_w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    GP_REAL_OR_RETURN(real, cuMemAllocManaged, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || gp_current_device(&dev) != 0)
        return real(dptr, bytesize, flags);
    GP_COUNTED_ALLOC(dev, bytesize, real(dptr, bytesize, flags), *dptr, GP_TRACK_PTR);
}

CUresult CUDAAPI gp_w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                         size_t Height, unsigned int ElementSizeBytes)
{
    GP_REAL_OR_RETURN(real, cuMemAllocPitch_v2, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || gp_current_device(&dev) != 0)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* the pitch is known only afterwards: reserve rows rounded to 512 bytes, then settle */
    uint64_t est = (((uint64_t)WidthInBytes + 511) & ~(uint64_t)511) * Height;
    if (gp_account_reserve(dev, est) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        gp_account_release(dev, est);
        return r;
    }
    uint64_t bytes = pPitch ? (uint64_t)*pPitch * Height : est;
    if (bytes != est)
        gp_account_adjust(dev, (int64_t)bytes - (int64_t)est);
    if (gp_limit(dev) != GP_UNLIMITED)
        gp_track_add(*dptr, GP_TRACK_PTR, dev, bytes);
    return r;
}

CUresult CUDAAPI gp_w_cuMemFree_v2(CUdeviceptr dptr)
{
    GP_REAL_OR_RETURN(real, cuMemFree_v2, CUDA_ERROR_NOT_FOUND);
    if (!limited())
        return real(dptr);
    GP_COUNTED_FREE(dptr, GP_TRACK_PTR, real(dptr));
}

/* Virtual memory management: the physical allocation names its device, so an allocator
 * thread with no current context (PyTorch's expandable segments) is counted right. */
CUresult CUDAAPI gp_w_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                  const CUmemAllocationProp *prop, unsigned long long flags)
{
    GP_REAL_OR_RETURN(real, cuMemCreate, CUDA_ERROR_NOT_FOUND);
    if (!limited() || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(handle, size, prop, flags);
    int dev = prop->location.id;
    GP_COUNTED_ALLOC(dev, size, real(handle, size, prop, flags), *handle, GP_TRACK_HANDLE);
}

CUresult CUDAAPI gp_w_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GP_REAL_OR_RETURN(real, cuMemRelease, CUDA_ERROR_NOT_FOUND);
    if (!limited())
        return real(handle);
    GP_COUNTED_FREE(handle, GP_TRACK_HANDLE, real(handle));
}

/* Stream-ordered allocations: counted on the stream's device at the call. */
#define GP_ASYNC_ALLOC(sym)                                                             \
    CUresult CUDAAPI gp_w_##sym(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)   \
    {                                                                                   \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                             \
        int dev;                                                                        \
        if (!limited() || gp_stream_device(hStream, &dev) != 0)                         \
            return real(dptr, bytesize, hStream);                                       \
        GP_COUNTED_ALLOC(dev, bytesize, real(dptr, bytesize, hStream), *dptr,           \
                         GP_TRACK_PTR);                                                 \
    }
GP_ASYNC_ALLOC(cuMemAllocAsync)
GP_ASYNC_ALLOC(cuMemAllocAsync_ptsz)

#define GP_POOL_ALLOC(sym)                                                              \
    CUresult CUDAAPI gp_w_##sym(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,  \
                                CUstream hStream)                                       \
    {                                                                                   \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                             \
        int dev;                                                                        \
        if (!limited() || gp_stream_device(hStream, &dev) != 0)                         \
            return real(dptr, bytesize, pool, hStream);                                 \
        GP_COUNTED_ALLOC(dev, bytesize, real(dptr, bytesize, pool, hStream), *dptr,     \
                         GP_TRACK_PTR);                                                 \
    }
GP_POOL_ALLOC(cuMemAllocFromPoolAsync)
GP_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)

#define GP_ASYNC_FREE(sym)                                                              \
    CUresult CUDAAPI gp_w_##sym(CUdeviceptr dptr, CUstream hStream)                     \
    {                                                                                   \
        GP_REAL_OR_RETURN(real, sym, CUDA_ERROR_NOT_FOUND);                             \
        if (!limited())                                                                 \
            return real(dptr, hStream);                                                 \
        GP_COUNTED_FREE(dptr, GP_TRACK_PTR, real(dptr, hStream));                       \
    }
GP_ASYNC_FREE(cuMemFreeAsync)
GP_ASYNC_FREE(cuMemFreeAsync_ptsz)

/* Arrays: bytes = elements x channels x element size. */
static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 16; /* unknown or packed formats: the most any format takes */
    }
}

static uint64_t dim(size_t v) { return v ? (uint64_t)v : 1; }

CUresult CUDAAPI gp_w_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    GP_REAL_OR_RETURN(real, cuArrayCreate_v2, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || !d || gp_current_device(&dev) != 0)
        return real(pHandle, d);
    uint64_t bytes = dim(d->Width) * dim(d->Height) * dim(d->NumChannels) * format_bytes(d->Format);
    GP_COUNTED_ALLOC(dev, bytes, real(pHandle, d), *pHandle, GP_TRACK_ARRAY);
}

CUresult CUDAAPI gp_w_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    GP_REAL_OR_RETURN(real, cuArray3DCreate_v2, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || !d || gp_current_device(&dev) != 0)
        return real(pHandle, d);
    uint64_t bytes = dim(d->Width) * dim(d->Height) * dim(d->Depth) * dim(d->NumChannels) *
                     format_bytes(d->Format);
    GP_COUNTED_ALLOC(dev, bytes, real(pHandle, d), *pHandle, GP_TRACK_ARRAY);
}

CUresult CUDAAPI gp_w_cuArrayDestroy(CUarray hArray)
{
    GP_REAL_OR_RETURN(real, cuArrayDestroy, CUDA_ERROR_NOT_FOUND);
    if (!limited())
        return real(hArray);
    GP_COUNTED_FREE((uintptr_t)hArray, GP_TRACK_ARRAY, real(hArray));
}

CUresult CUDAAPI gp_w_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                             const CUDA_ARRAY3D_DESCRIPTOR *d,
                                             unsigned int numLevels)
{
    GP_REAL_OR_RETURN(real, cuMipmappedArrayCreate, CUDA_ERROR_NOT_FOUND);
    int dev;
    if (!limited() || !d || gp_current_device(&dev) != 0)
        return real(pHandle, d, numLevels);
    uint64_t bytes = 0, w = dim(d->Width), h = dim(d->Height), z = dim(d->Depth);
    for (unsigned l = 0; l < (numLevels ? numLevels : 1); l++) {
        bytes += w * h * z * dim(d->NumChannels) * format_bytes(d->Format);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    GP_COUNTED_ALLOC(dev, bytes, real(pHandle, d, numLevels), *pHandle, GP_TRACK_MIPMAP);
}

CUresult CUDAAPI gp_w_cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    GP_REAL_OR_RETURN(real, cuMipmappedArrayDestroy, CUDA_ERROR_NOT_FOUND);
    if (!limited())
        return real(h);
    GP_COUNTED_FREE((uintptr_t)h, GP_TRACK_MIPMAP, real(h));
}

/* ---- what the process is told ---- */

static void clamp(uint64_t limit, uint64_t used, size_t *freep, size_t *totalp)
{
    uint64_t total = limit < (uint64_t)*totalp ? limit : (uint64_t)*totalp;
    uint64_t avail = used >= total ? 0 : total - used;
    if (freep && avail < (uint64_t)*freep)
        *freep = (size_t)avail;
    *totalp = (size_t)total;
}

CUresult CUDAAPI gp_w_cuMemGetInfo_v2(size_t *freep, size_t *totalp)
{
    GP_REAL_OR_RETURN(real, cuMemGetInfo_v2, CUDA_ERROR_NOT_FOUND);
    CUresult r = real(freep, totalp);
    int dev;
    if (r != CUDA_SUCCESS || !limited() || !totalp || gp_current_device(&dev) != 0)
        return r;
    uint64_t limit = gp_limit(dev);
    if (limit != GP_UNLIMITED)
        clamp(limit, gp_cfg.mode == GP_MODE_REFUSE ? 0 : gp_account_used(dev), freep, totalp);
    return r;
}

CUresult CUDAAPI gp_w_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    GP_REAL_OR_RETURN(real, cuDeviceTotalMem_v2, CUDA_ERROR_NOT_FOUND);
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && limited() && bytes && gp_limit(dev) < (uint64_t)*bytes)
        *bytes = (size_t)gp_limit(dev);
    return r;
}
