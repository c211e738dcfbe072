/* Minimal extended-attribute tool for the busybox guest (no getfattr there).
 *   vfsd-xattr set PATH NAME VALUE   set (creates or replaces)
 *   vfsd-xattr get PATH NAME         print the value
 *   vfsd-xattr list PATH             print names, one per line
 *   vfsd-xattr remove PATH NAME      remove
 * The l* variants act on a symlink itself: lset, lget, llist, lremove.
 * Exit status: 0 ok, 1 error (errno name printed), 2 usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

static int fail(const char *what)
{
    fprintf(stderr, "vfsd-xattr: %s: %s (errno %d)\n", what, strerror(errno), errno);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: vfsd-xattr set|get|list|remove|lset|lget|llist|lremove PATH [NAME [VALUE]]\n");
        return 2;
    }
    const char *op = argv[1], *path = argv[2];
    int nofollow = op[0] == 'l' && strcmp(op, "list") != 0;
    if (nofollow)
        op++;

    if (!strcmp(op, "set") && argc == 5) {
        int r = nofollow ? lsetxattr(path, argv[3], argv[4], strlen(argv[4]), 0)
                         : setxattr(path, argv[3], argv[4], strlen(argv[4]), 0);
        return r ? fail("setxattr") : 0;
    }
    if (!strcmp(op, "get") && argc == 4) {
        char buf[65536];
        ssize_t n = nofollow ? lgetxattr(path, argv[3], buf, sizeof buf)
                             : getxattr(path, argv[3], buf, sizeof buf);
        if (n < 0)
            return fail("getxattr");
        fwrite(buf, 1, (size_t)n, stdout);
        putchar('\n');
        return 0;
    }
    if (!strcmp(op, "list") && argc == 3) {
        char buf[65536];
        ssize_t n = nofollow ? llistxattr(path, buf, sizeof buf) : listxattr(path, buf, sizeof buf);
        if (n < 0)
            return fail("listxattr");
        for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
            puts(buf + i);
        return 0;
    }
    if (!strcmp(op, "remove") && argc == 4) {
        int r = nofollow ? lremovexattr(path, argv[3]) : removexattr(path, argv[3]);
        return r ? fail("removexattr") : 0;
    }
    fprintf(stderr, "vfsd-xattr: bad arguments (run without arguments for usage)\n");
    return 2;
}
