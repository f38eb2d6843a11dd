/* call_all: calls every hooked symbol the preloaded library exports, with zeroed
 * arguments, against a driver that lacks them all. Each must answer with its "not found"
 * error instead of calling NULL. Prints "NAME RC" per hook. */
#include <dlfcn.h>
#include <stdio.h>

typedef long (*any_fn)(long, long, long, long, long, long, long, long, long, long, long);

int main(void)
{
    int (*count)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_hook_count");
    const char *(*name)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "gpupool_hook_name");
    if (!count || !name) {
        printf("not preloaded\n");
        return 2;
    }
    for (int i = 0; i < count(); i++) {
        const char *n = name(i);
        if (!n)
            continue;
        any_fn f = (any_fn)dlsym(RTLD_DEFAULT, n);
        int rc = f ? (int)f(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) : -1;
        printf("%s %d\n", n, rc);
    }
    return 0;
}
