/* A fake libnvidia-ml.so.1: FAKE_NVML_DEVICES devices (default 2) named FAKE_NVML_NAME
 * (default "NVIDIA H100 80GB HBM3") of FAKE_NVML_MEM bytes (default 80 GiB), FAKE_NVML_USED
 * bytes used and FAKE_NVML_RESERVED reserved on each, FAKE_NVML_UTIL percent busy (default
 * 0). Enough of NVML for the interception library's tests and for pynvml (nvidia-ml-py),
 * so the hub can discover its inventory from it (scripts/gpu-e2e --fake). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvml.h>

struct fake_dev {
    unsigned index;
};
static struct fake_dev devs[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

static unsigned long long env_ull(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 10) : dflt;
}
static unsigned count(void) { unsigned n = (unsigned)env_ull("FAKE_NVML_DEVICES", 2); return n > 8 ? 8 : n; }

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return NVML_SUCCESS; }

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = count(); return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (i >= count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)&devs[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    *i = ((struct fake_dev *)d)->index;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    const char *v = getenv("FAKE_NVML_NAME");
    snprintf(name, len, "%s", v && *v ? v : "NVIDIA H100 80GB HBM3");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    u->gpu = (unsigned)env_ull("FAKE_NVML_UTIL", 0);
    u->memory = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    snprintf(uuid, len, "GPU-fa4e0000-0000-0000-0000-00000000000%u", ((struct fake_dev *)d)->index);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    m->total = env_ull("FAKE_NVML_MEM", 80ull << 30);
    m->used = env_ull("FAKE_NVML_USED", 0);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    m->total = env_ull("FAKE_NVML_MEM", 80ull << 30);
    m->reserved = env_ull("FAKE_NVML_RESERVED", 0);
    m->used = env_ull("FAKE_NVML_USED", 0) + m->reserved;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
