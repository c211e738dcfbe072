/* LD_PRELOAD shim: add O_DIRECT to every open of the file named by
 * $VFSD_ODIRECT_FILE (matched by its last path component), so tools without
 * an O_DIRECT switch (fsx-rs) exercise the direct I/O path.  Prints one
 * notice to stderr the first time it does so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int wants_direct(const char *path)
{
    const char *want = getenv("VFSD_ODIRECT_FILE");
    if (!want || !*want || !path)
        return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *wbase = strrchr(want, '/');
    wbase = wbase ? wbase + 1 : want;
    return strcmp(base, wbase) == 0;
}

static int adjust(const char *path, int flags)
{
    static int told;
    if (wants_direct(path)) {
        flags |= O_DIRECT;
        if (!told) {
            told = 1;
            fprintf(stderr, "odirect-preload: opening %s with O_DIRECT\n", path);
        }
    }
    return flags;
}

#define WRAP_OPEN(name)                                                    \
    int name(const char *path, int flags, ...)                             \
    {                                                                      \
        static int (*real)(const char *, int, ...);                       \
        mode_t mode = 0;                                                   \
        if (!real)                                                         \
            real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name); \
        if (flags & (O_CREAT | O_TMPFILE)) {                               \
            va_list ap;                                                    \
            va_start(ap, flags);                                           \
            mode = va_arg(ap, mode_t);                                     \
            va_end(ap);                                                    \
        }                                                                  \
        return real(path, adjust(path, flags), mode);                      \
    }

#define WRAP_OPENAT(name)                                                  \
    int name(int dirfd, const char *path, int flags, ...)                  \
    {                                                                      \
        static int (*real)(int, const char *, int, ...);                  \
        mode_t mode = 0;                                                   \
        if (!real)                                                         \
            real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name); \
        if (flags & (O_CREAT | O_TMPFILE)) {                               \
            va_list ap;                                                    \
            va_start(ap, flags);                                           \
            mode = va_arg(ap, mode_t);                                     \
            va_end(ap);                                                    \
        }                                                                  \
        return real(dirfd, path, adjust(path, flags), mode);               \
    }

WRAP_OPEN(open)
WRAP_OPEN(open64)
WRAP_OPENAT(openat)
WRAP_OPENAT(openat64)
