/* dlsym and dlvsym: a program that dlopens the driver and looks symbols up by name gets
 * our wrappers for hooked names. The loader's own dlsym/dlvsym are found by reading the
 * dynamic symbol table of the next object that defines them (we cannot ask dlsym for
 * dlsym once we are dlsym). */

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include "gpupool.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlsym_fn real_dlsym_p;
static dlvsym_fn real_dlvsym_p;

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

static uint32_t sysv_hash(const char *s)
{
    uint32_t h = 0, g;
    for (; *s; s++) {
        h = (h << 4) + (unsigned char)*s;
        g = h & 0xf0000000u;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

struct find {
    const char *name;
    void *self_base;
    void *found;
};

static int defined(const ElfW(Sym) *s)
{
    return s->st_shndx != SHN_UNDEF && s->st_value != 0 &&
           (ELF64_ST_TYPE(s->st_info) == STT_FUNC || ELF64_ST_TYPE(s->st_info) == STT_GNU_IFUNC);
}

static void *lookup(ElfW(Addr) base, const ElfW(Dyn) *dyn, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL, *sh = NULL;
#define GP_DPTR(d) ((d)->d_un.d_ptr < base ? (d)->d_un.d_ptr + base : (d)->d_un.d_ptr)
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB)
            symtab = (const void *)GP_DPTR(dyn);
        else if (dyn->d_tag == DT_STRTAB)
            strtab = (const void *)GP_DPTR(dyn);
        else if (dyn->d_tag == DT_GNU_HASH)
            gh = (const void *)GP_DPTR(dyn);
        else if (dyn->d_tag == DT_HASH)
            sh = (const void *)GP_DPTR(dyn);
    }
#undef GP_DPTR
    if (!symtab || !strtab)
        return NULL;
    const ElfW(Sym) *s = NULL;
    if (gh) {
        uint32_t nb = gh[0], off = gh[1], bloom_n = gh[2];
        const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gh[4] + bloom_n);
        const uint32_t *chain = buckets + nb;
        uint32_t h = gnu_hash(name);
        uint32_t i = buckets[h % nb];
        if (i < off)
            return NULL;
        for (;; i++) {
            uint32_t h2 = chain[i - off];
            if ((h | 1) == (h2 | 1) && strcmp(strtab + symtab[i].st_name, name) == 0 &&
                defined(&symtab[i])) {
                s = &symtab[i];
                break;
            }
            if (h2 & 1)
                break;
        }
    } else if (sh) {
        uint32_t nb = sh[0];
        const uint32_t *buckets = sh + 2, *chain = buckets + nb;
        for (uint32_t i = buckets[sysv_hash(name) % nb]; i; i = chain[i])
            if (strcmp(strtab + symtab[i].st_name, name) == 0 && defined(&symtab[i])) {
                s = &symtab[i];
                break;
            }
    }
    if (!s)
        return NULL;
    void *p = (void *)(base + s->st_value);
    if (ELF64_ST_TYPE(s->st_info) == STT_GNU_IFUNC)
        p = ((void *(*)(void))p)();
    return p;
}

static int each_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct find *f = arg;
    if ((void *)info->dlpi_addr == f->self_base || info->dlpi_addr == 0)
        return 0; /* ourselves, and the main program */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
            continue;
        const ElfW(Dyn) *dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        f->found = lookup(info->dlpi_addr, dyn, f->name);
        return f->found != NULL;
    }
    return 0;
}

static void *find_next(const char *name)
{
    Dl_info self;
    struct find f = {name, NULL, NULL};
    if (dladdr((void *)&find_next, &self))
        f.self_base = self.dli_fbase;
    dl_iterate_phdr(each_object, &f);
    return f.found;
}

static void dl_init(void)
{
    if (GP_LIKELY(real_dlsym_p != NULL))
        return;
    /* idempotent: racing threads compute the same pointers */
    __atomic_store_n(&real_dlvsym_p, (dlvsym_fn)find_next("dlvsym"), __ATOMIC_RELEASE);
    __atomic_store_n(&real_dlsym_p, (dlsym_fn)find_next("dlsym"), __ATOMIC_RELEASE);
}

void *gp_real_dlsym(void *handle, const char *name)
{
    dl_init();
    return real_dlsym_p ? real_dlsym_p(handle, name) : NULL;
}

void *gp_real_dlvsym(void *handle, const char *name, const char *version)
{
    dl_init();
    return real_dlvsym_p ? real_dlvsym_p(handle, name, version) : NULL;
}

static int maybe_hooked(const char *name)
{
    return name && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v'));
}

GP_EXPORT void *dlsym(void *handle, const char *name)
{
    dl_init();
    if (GP_UNLIKELY(!real_dlsym_p))
        return NULL;
    if (maybe_hooked(name)) {
        int id = gp_hook_find(name);
        if (id >= 0)
            return real_dlsym_p(handle, name) ? gp_hook_wrapper(id) : NULL;
    }
    /* a tail call: the loader sees our caller's return address, so RTLD_NEXT keeps its
     * meaning for everything we do not hook */
    return real_dlsym_p(handle, name);
}

GP_EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
    dl_init();
    if (GP_UNLIKELY(!real_dlvsym_p))
        return NULL;
    if (maybe_hooked(name)) {
        int id = gp_hook_find(name);
        if (id >= 0)
            return real_dlvsym_p(handle, name, version) ? gp_hook_wrapper(id) : NULL;
    }
    return real_dlvsym_p(handle, name, version);
}
