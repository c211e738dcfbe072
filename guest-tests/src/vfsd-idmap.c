/* Idmapped mounts for the guest tests (busybox has no X-mount.idmap).
 *
 *   vfsd-idmap mount SRC DST MAP   bind-mounts SRC at DST with the idmapping MAP, for
 *                                  uids and gids alike: "INSIDE OUTSIDE COUNT" ranges
 *                                  joined by ',' (a file owned by INSIDE on SRC shows as
 *                                  OUTSIDE at DST, and OUTSIDE creating there makes INSIDE)
 *   vfsd-idmap as UID:GID CMD...   runs CMD with those ids and no supplementary groups
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/mount.h>

static void die(const char *what) {
    fprintf(stderr, "vfsd-idmap: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die(path);
    close(fd);
}

/* A user namespace whose uid and gid maps are MAP, as an fd. */
static int userns(const char *map) {
    int go[2], ready[2];
    if (pipe(go) || pipe(ready)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    char c;
    if (pid == 0) {
        if (unshare(CLONE_NEWUSER)) die("unshare");
        if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1) _exit(1);
        _exit(0);
    }
    if (read(ready[0], &c, 1) != 1) die("child");
    char lines[4096], path[64];
    snprintf(lines, sizeof lines, "%s\n", map);
    for (char *p = lines; *p; p++)
        if (*p == ',') *p = '\n';
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    write_file(path, lines);
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    write_file(path, lines);
    snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    if (write(go[1], "g", 1) != 1) die("child");
    waitpid(pid, NULL, 0);
    return fd;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "mount")) {
        int ns = userns(argv[4]);
        int tree = syscall(SYS_open_tree, AT_FDCWD, argv[2], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0) die("open_tree");
        struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)ns};
        if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr)) die("mount_setattr");
        if (syscall(SYS_move_mount, tree, "", AT_FDCWD, argv[3], MOVE_MOUNT_F_EMPTY_PATH)) die("move_mount");
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "as")) {
        unsigned uid, gid;
        if (sscanf(argv[2], "%u:%u", &uid, &gid) != 2) {
            fprintf(stderr, "vfsd-idmap: as UID:GID, not %s\n", argv[2]);
            return 2;
        }
        if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid)) die("set ids");
        execvp(argv[3], argv + 3);
        die(argv[3]);
    }
    fprintf(stderr, "usage: vfsd-idmap mount SRC DST MAP | vfsd-idmap as UID:GID CMD...\n");
    return 2;
}
