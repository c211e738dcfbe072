/* vfsd-newops: file operations a guest shell can't do with busybox.
 *   vfsd-newops tmpfile DIR NAME [proc]  O_TMPFILE in DIR, write "tmpfile data", then
 *                                        linkat(AT_EMPTY_PATH) to DIR/NAME, or with "proc"
 *                                        through /proc/self/fd (no CAP_DAC_READ_SEARCH)
 *   vfsd-newops tmpfile-excl DIR NAME    O_TMPFILE|O_EXCL: the link must fail (ENOENT)
 *   vfsd-newops btime FILE               statx birth time in seconds, or "none"
 *   vfsd-newops open-trunc FILE          open(O_RDONLY|O_TRUNC): prints "opened" or the
 *                                        errno's name (ETXTBSY, EACCES) or number
 * Exit status 0 on success; errors go to stderr with the failing call. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "vfsd-newops: %s: %s\n", what, strerror(errno));
    return 1;
}

static int tmpfile_link(const char *dir, const char *name, int excl, int proc)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | (excl ? O_EXCL : 0), 0640);
    if (fd < 0)
        return fail("open(O_TMPFILE)");
    const char data[] = "tmpfile data";
    if (write(fd, data, sizeof(data) - 1) != (ssize_t)(sizeof(data) - 1))
        return fail("write");
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int r;
    if (proc) {
        char src[64];
        snprintf(src, sizeof(src), "/proc/self/fd/%d", fd);
        r = linkat(AT_FDCWD, src, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
    } else {
        r = linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH);
    }
    if (excl) {
        if (r == 0) {
            fprintf(stderr, "vfsd-newops: an O_EXCL tmpfile was linked\n");
            return 1;
        }
        return errno == ENOENT ? 0 : fail("linkat of an O_EXCL tmpfile (want ENOENT)");
    }
    if (r < 0)
        return fail("linkat");
    return close(fd) < 0 ? fail("close") : 0;
}

static int open_trunc(const char *path)
{
    int fd = open(path, O_RDONLY | O_TRUNC);
    if (fd >= 0) {
        printf("opened\n");
        return close(fd) < 0 ? fail("close") : 0;
    }
    if (errno == ETXTBSY)
        printf("ETXTBSY\n");
    else if (errno == EACCES)
        printf("EACCES\n");
    else
        printf("errno %d\n", errno);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "tmpfile"))
        return tmpfile_link(argv[2], argv[3], 0, argc > 4 && !strcmp(argv[4], "proc"));
    if (argc == 4 && !strcmp(argv[1], "tmpfile-excl"))
        return tmpfile_link(argv[2], argv[3], 1, 0);
    if (argc == 3 && !strcmp(argv[1], "btime")) {
        struct statx stx;
        if (statx(AT_FDCWD, argv[2], 0, STATX_BTIME, &stx) < 0)
            return fail("statx");
        if (stx.stx_mask & STATX_BTIME)
            printf("%lld\n", (long long)stx.stx_btime.tv_sec);
        else
            printf("none\n");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "open-trunc"))
        return open_trunc(argv[2]);
    fprintf(stderr, "usage: vfsd-newops tmpfile DIR NAME [proc] | tmpfile-excl DIR NAME | "
                    "btime FILE | open-trunc FILE\n");
    return 2;
}
