/* cudart_probe LIBCUDART: loads the real CUDA runtime and makes it initialise against
 * whatever libcuda.so.1 is on the search path; prints what cudaGetDeviceCount said. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    void *rt = dlopen(argv[1], RTLD_NOW);
    if (!rt) {
        printf("dlopen failed: %s\n", dlerror());
        return 2;
    }
    int (*count)(int *) = (int (*)(int *))dlsym(rt, "cudaGetDeviceCount");
    const char *(*err)(int) = (const char *(*)(int))dlsym(rt, "cudaGetErrorString");
    int n = -1;
    int rc = count(&n);
    printf("cudaGetDeviceCount rc=%d (%s) n=%d\n", rc, err(rc), n);
    return 0;
}
