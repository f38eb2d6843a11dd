/* NVML: nvidia-smi and monitoring libraries inside the container see the cap. NVML counts
 * devices physically; the cap is per CUDA ordinal, so the device is mapped through
 * CUDA_VISIBLE_DEVICES (indices or UUIDs). A device the container cannot see is reported
 * unchanged. */
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"

static int nvml_ordinal(nvmlDevice_t device)
{
    gp_pfn_nvmlDeviceGetIndex idx_fn = (gp_pfn_nvmlDeviceGetIndex)gp_real_get(GP_H_nvmlDeviceGetIndex);
    gp_pfn_nvmlDeviceGetUUID uuid_fn = (gp_pfn_nvmlDeviceGetUUID)gp_real_get(GP_H_nvmlDeviceGetUUID);
    unsigned int idx;
    if (!idx_fn || idx_fn(device, &idx) != NVML_SUCCESS)
        return -1;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd)
        return (int)idx;
    char uuid[96] = "";
    int pos = 0;
    for (const char *p = cvd; *p; pos++) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && *p == ' ')
            p++, n--;
        if (n && *p >= '0' && *p <= '9') {
            char *stop;
            long v = strtol(p, &stop, 10);
            if (stop != p + n || v < 0)
                return -1; /* CUDA stops at the first bad entry */
            if ((unsigned long)v == idx)
                return pos;
        } else if (n) {
            if (!uuid[0] && (!uuid_fn || uuid_fn(device, uuid, sizeof uuid) != NVML_SUCCESS))
                return -1;
            if (n <= strlen(uuid) && strncmp(uuid, p, n) == 0) /* CUDA accepts a prefix */
                return pos;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return -1;
}

static uint64_t cap_for(nvmlDevice_t device, int *ord)
{
    if (gp_config()->mode == GP_MODE_OFF)
        return GP_UNLIMITED;
    *ord = nvml_ordinal(device);
    return gp_cfg.mode == GP_MODE_REFUSE ? 0 : *ord < 0 ? GP_UNLIMITED : gp_limit(*ord);
}

static uint64_t used_for(int ord) { return gp_cfg.mode == GP_MODE_REFUSE ? 0 : gp_account_used(ord); }

/* Both memory queries report the share: total = min(cap, physical), used as counted (for
 * _v2 plus the driver's reserved memory, which is part of its used), free never below 0. */
static void report(uint64_t cap, int ord, unsigned long long *total, unsigned long long *used,
                   unsigned long long *free_, unsigned long long *reserved)
{
    uint64_t t = cap < *total ? cap : *total;
    uint64_t res = reserved ? (*reserved < t ? *reserved : t) : 0;
    uint64_t u = used_for(ord) + res;
    *total = t;
    if (reserved)
        *reserved = res;
    *used = u;
    *free_ = u >= t ? 0 : t - u;
}

nvmlReturn_t gp_w_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    GP_REAL_OR_RETURN(real, nvmlDeviceGetMemoryInfo, NVML_ERROR_FUNCTION_NOT_FOUND);
    nvmlReturn_t r = real(device, memory);
    int ord = -1;
    uint64_t cap;
    if (r != NVML_SUCCESS || !memory || (cap = cap_for(device, &ord)) == GP_UNLIMITED)
        return r;
    report(cap, ord, &memory->total, &memory->used, &memory->free, NULL);
    return r;
}

nvmlReturn_t gp_w_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    GP_REAL_OR_RETURN(real, nvmlDeviceGetMemoryInfo_v2, NVML_ERROR_FUNCTION_NOT_FOUND);
    nvmlReturn_t r = real(device, memory);
    int ord = -1;
    uint64_t cap;
    if (r != NVML_SUCCESS || !memory || (cap = cap_for(device, &ord)) == GP_UNLIMITED)
        return r;
    report(cap, ord, &memory->total, &memory->used, &memory->free, &memory->reserved);
    return r;
}
