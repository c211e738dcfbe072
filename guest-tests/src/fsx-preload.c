/* LD_PRELOAD shim for fsx-rs (guest-tests/fsx.sh).  Two independent features:
 *
 * VFSD_ODIRECT_FILE=NAME: add O_DIRECT to every open of the file whose last
 *   path component is NAME, so fsx-rs (which has no O_DIRECT switch)
 *   exercises the direct I/O path.  O_DIRECT needs aligned user buffers,
 *   which fsx-rs does not provide, so pread/pwrite on O_DIRECT descriptors
 *   with an unaligned buffer go through an aligned bounce buffer (offsets
 *   and sizes are passed on unchanged).  Prints one notice to stderr the
 *   first time it adds O_DIRECT.
 *
 * VFSD_FSX_UNMAP=1: fsx-rs 0.3.2 never unmaps the mapping of a "mapread"
 *   operation.  The leaked mappings pile up and make every truncate and
 *   mmap slower (the kernel walks all mappings of the file), so long runs
 *   become quadratic.  With this set, a shared file mapping that is still
 *   mapped when the next shared file mapping is created is unmapped first
 *   (fsx-rs never uses a mapping after the operation that made it). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
            fprintf(stderr, "fsx-preload: opening %s with O_DIRECT\n", path);
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

#define ALIGN 4096

static int needs_bounce(int fd, const void *buf)
{
    if (((uintptr_t)buf % ALIGN) == 0)
        return 0;
    int fl = fcntl(fd, F_GETFL);
    return fl != -1 && (fl & O_DIRECT);
}

#define WRAP_PREAD(name)                                                   \
    ssize_t name(int fd, void *buf, size_t n, off_t off)                   \
    {                                                                      \
        static ssize_t (*real)(int, void *, size_t, off_t);                \
        if (!real)                                                         \
            real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, #name); \
        if (!needs_bounce(fd, buf) || n == 0)                              \
            return real(fd, buf, n, off);                                  \
        void *b;                                                           \
        if (posix_memalign(&b, ALIGN, n))                                  \
            return real(fd, buf, n, off);                                  \
        ssize_t r = real(fd, b, n, off);                                   \
        if (r > 0)                                                         \
            memcpy(buf, b, (size_t)r);                                     \
        free(b);                                                           \
        return r;                                                          \
    }

#define WRAP_PWRITE(name)                                                  \
    ssize_t name(int fd, const void *buf, size_t n, off_t off)             \
    {                                                                      \
        static ssize_t (*real)(int, const void *, size_t, off_t);          \
        if (!real)                                                         \
            real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, #name); \
        if (!needs_bounce(fd, buf) || n == 0)                              \
            return real(fd, buf, n, off);                                  \
        void *b;                                                           \
        if (posix_memalign(&b, ALIGN, n))                                  \
            return real(fd, buf, n, off);                                  \
        memcpy(b, buf, n);                                                 \
        ssize_t r = real(fd, b, n, off);                                   \
        free(b);                                                           \
        return r;                                                          \
    }

WRAP_PREAD(pread)
WRAP_PREAD(pread64)
WRAP_PWRITE(pwrite)
WRAP_PWRITE(pwrite64)

/* --- leaked mapread mappings ------------------------------------------- */
static void *last_map = MAP_FAILED;
static size_t last_len;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    static void *(*real)(void *, size_t, int, int, int, off_t);
    static int (*real_munmap)(void *, size_t);
    static int enabled = -1;
    if (!real) {
        real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
        real_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    }
    if (enabled < 0) {
        const char *e = getenv("VFSD_FSX_UNMAP");
        enabled = e && *e == '1';
    }
    int tracked = enabled && fd >= 0 && (flags & MAP_SHARED);
    if (tracked && last_map != MAP_FAILED) {
        real_munmap(last_map, last_len);
        last_map = MAP_FAILED;
    }
    void *p = real(addr, len, prot, flags, fd, off);
    if (tracked && p != MAP_FAILED) {
        last_map = p;
        last_len = len;
    }
    return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
    static int (*real)(void *, size_t);
    if (!real)
        real = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    if (addr == last_map)
        last_map = MAP_FAILED;
    return real(addr, len);
}
