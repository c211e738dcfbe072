/* vfsd-mmap: store to or load from a file through a MAP_SHARED mapping.
 *   vfsd-mmap write FILE OFFSET STRING   map FILE shared, copy STRING to OFFSET, msync
 *   vfsd-mmap read FILE OFFSET LEN       map FILE shared, print LEN bytes at OFFSET
 * Exit status 0 on success; errors go to stderr with the failing call. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "vfsd-mmap: %s: %s\n", what, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "write") && strcmp(argv[1], "read"))) {
        fprintf(stderr, "usage: vfsd-mmap write FILE OFFSET STRING | read FILE OFFSET LEN\n");
        return 2;
    }
    int writing = !strcmp(argv[1], "write");
    off_t off = strtoll(argv[3], NULL, 0);
    size_t len = writing ? strlen(argv[4]) : strtoul(argv[4], NULL, 0);
    int fd = open(argv[2], writing ? O_RDWR : O_RDONLY);
    if (fd < 0)
        return fail("open");
    struct stat st;
    if (fstat(fd, &st) < 0)
        return fail("fstat");
    if (off < 0 || (off_t)(off + len) > st.st_size) {
        fprintf(stderr, "vfsd-mmap: range past the end of the file\n");
        return 1;
    }
    char *p = mmap(NULL, st.st_size, writing ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return fail("mmap");
    if (writing) {
        memcpy(p + off, argv[4], len);
        if (msync(p, st.st_size, MS_SYNC) < 0)
            return fail("msync");
    } else {
        fwrite(p + off, 1, len, stdout);
    }
    if (munmap(p, st.st_size) < 0)
        return fail("munmap");
    return close(fd) < 0 ? fail("close") : 0;
}
