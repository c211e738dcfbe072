/* Lock tool for the vfsd lock tests, in the busybox guest and on the host.
 *
 *   vfsd-lock [OPTIONS] FILE SPEC...   take every lock in SPEC on FILE (one open file)
 *     SPEC: wr:START:LEN | rd:START:LEN   classic POSIX lock, fcntl F_SETLK(W)
 *           owr:START:LEN | ord:START:LEN OFD lock, F_OFD_SETLK(W)
 *           ex | sh                       flock LOCK_EX / LOCK_SH
 *           (LEN 0 = to the end of the file, as fcntl)
 *     -w        wait for each lock (F_SETLKW, flock without LOCK_NB); default: do not wait
 *     -g        only test with F_GETLK / F_OFD_GETLK and print the conflicting lock;
 *               exit 0 if the lock could be placed, 1 if not (not for ex/sh)
 *     -m PATH   create PATH once all locks are held
 *     -u PATH   then hold them until PATH exists (polled every 10 ms)
 *     -t SECS   then hold them SECS more seconds (fractions allowed)
 *     -s PATH   create PATH just before releasing (its host mtime stamps the release)
 *     -q        quiet
 *   Prints "granted after N.NNNs" (time spent acquiring) or "busy".
 *   Exit status: 0 granted; 1 refused (EAGAIN, EACCES, EWOULDBLOCK); 2 other error.
 *
 *   vfsd-lock count FILE N flock|fcntl|ofd|none
 *     N times: open FILE, lock it whole (blocking; not with none), read a decimal
 *     number, write it back plus one, unlock, close.  Prints the time taken.
 *
 *   vfsd-lock mtime PATH...   print st_mtime as SECONDS.NANOSECONDS, one per line
 *   vfsd-lock now             print CLOCK_REALTIME the same way
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int quiet;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "vfsd-lock: create %s: %s\n", path, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

static int busy_errno(int e)
{
    return e == EAGAIN || e == EACCES || e == EWOULDBLOCK;
}

struct spec {
    int flock_op;     /* LOCK_EX / LOCK_SH, or 0 for a byte range */
    int ofd;
    short type;       /* F_RDLCK / F_WRLCK */
    long long start, len;
};

static int parse_spec(const char *s, struct spec *sp)
{
    char kind[8];
    memset(sp, 0, sizeof *sp);
    if (!strcmp(s, "ex")) { sp->flock_op = LOCK_EX; return 0; }
    if (!strcmp(s, "sh")) { sp->flock_op = LOCK_SH; return 0; }
    if (sscanf(s, "%7[a-z]:%lld:%lld", kind, &sp->start, &sp->len) != 3)
        return -1;
    if (!strcmp(kind, "wr")) sp->type = F_WRLCK;
    else if (!strcmp(kind, "rd")) sp->type = F_RDLCK;
    else if (!strcmp(kind, "owr")) { sp->type = F_WRLCK; sp->ofd = 1; }
    else if (!strcmp(kind, "ord")) { sp->type = F_RDLCK; sp->ofd = 1; }
    else return -1;
    return 0;
}

static const char *type_name(short t)
{
    return t == F_RDLCK ? "rd" : t == F_WRLCK ? "wr" : t == F_UNLCK ? "unlocked" : "?";
}

static int whole_lock(int fd, const char *how, short type)
{
    if (!strcmp(how, "flock"))
        return flock(fd, type == F_UNLCK ? LOCK_UN : LOCK_EX);
    if (!strcmp(how, "fcntl") || !strcmp(how, "ofd")) {
        struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
        return fcntl(fd, how[0] == 'o' ? F_OFD_SETLKW : F_SETLKW, &fl);
    }
    return 0;
}

static int count(const char *path, long n, const char *how)
{
    if (strcmp(how, "flock") && strcmp(how, "fcntl") && strcmp(how, "ofd") && strcmp(how, "none")) {
        fprintf(stderr, "vfsd-lock count: lock kind must be flock, fcntl, ofd or none\n");
        return 2;
    }
    double t0 = mono();
    for (long i = 0; i < n; i++) {
        int fd = open(path, O_RDWR | O_CREAT, 0644);
        if (fd < 0) { perror("vfsd-lock count: open"); return 2; }
        if (whole_lock(fd, how, F_WRLCK) != 0) { perror("vfsd-lock count: lock"); return 2; }
        char buf[64];
        ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
        if (r < 0) { perror("vfsd-lock count: read"); return 2; }
        buf[r] = 0;
        long v = strtol(buf, NULL, 10) + 1;
        int len = snprintf(buf, sizeof buf, "%ld\n", v);
        if (pwrite(fd, buf, len, 0) != len) { perror("vfsd-lock count: write"); return 2; }
        if (whole_lock(fd, how, F_UNLCK) != 0) { perror("vfsd-lock count: unlock"); return 2; }
        close(fd);
    }
    double dt = mono() - t0;
    printf("%ld increments (%s) in %.1fs, %.2f ms each\n", n, how, dt, n ? dt * 1000 / n : 0);
    return 0;
}

static int print_mtime(int argc, char **argv)
{
    int rc = 0;
    for (int i = 2; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "vfsd-lock: stat %s: %s\n", argv[i], strerror(errno)); rc = 2; continue; }
        printf("%lld.%09ld\n", (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    }
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: vfsd-lock [-w] [-g] [-q] [-m PATH] [-u PATH] [-t SECS] [-s PATH] FILE SPEC...\n"
                    "       vfsd-lock count FILE N flock|fcntl|ofd|none\n"
                    "       vfsd-lock mtime PATH... | vfsd-lock now\n"
                    "SPEC: wr:START:LEN rd:START:LEN owr:START:LEN ord:START:LEN ex sh\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "count")) {
        if (argc != 5) usage();
        setvbuf(stdout, NULL, _IOLBF, 0);
        return count(argv[2], atol(argv[3]), argv[4]);
    }
    if (argc >= 2 && !strcmp(argv[1], "mtime"))
        return print_mtime(argc, argv);
    if (argc == 2 && !strcmp(argv[1], "now")) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        printf("%lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
        return 0;
    }

    int wait = 0, test = 0, opt;
    const char *marker = NULL, *until = NULL, *stamp = NULL;
    double hold = 0;
    while ((opt = getopt(argc, argv, "wgqm:u:t:s:")) != -1) {
        switch (opt) {
        case 'w': wait = 1; break;
        case 'g': test = 1; break;
        case 'q': quiet = 1; break;
        case 'm': marker = optarg; break;
        case 'u': until = optarg; break;
        case 't': hold = atof(optarg); break;
        case 's': stamp = optarg; break;
        default: usage();
        }
    }
    if (argc - optind < 2) usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *path = argv[optind];
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) { fprintf(stderr, "vfsd-lock: open %s: %s\n", path, strerror(errno)); return 2; }

    double t0 = mono();
    for (int i = optind + 1; i < argc; i++) {
        struct spec sp;
        if (parse_spec(argv[i], &sp) != 0) usage();
        int r;
        if (sp.flock_op) {
            if (test) usage();
            r = flock(fd, sp.flock_op | (wait ? 0 : LOCK_NB));
        } else {
            struct flock fl = { .l_type = sp.type, .l_whence = SEEK_SET, .l_start = sp.start, .l_len = sp.len };
            int cmd = test ? (sp.ofd ? F_OFD_GETLK : F_GETLK)
                           : sp.ofd ? (wait ? F_OFD_SETLKW : F_OFD_SETLK) : (wait ? F_SETLKW : F_SETLK);
            r = fcntl(fd, cmd, &fl);
            if (r == 0 && test) {
                if (fl.l_type == F_UNLCK) {
                    if (!quiet) printf("%s: no conflict\n", argv[i]);
                    continue;
                }
                if (!quiet)
                    printf("%s: conflicts with %s lock at %lld len %lld pid %d\n", argv[i],
                           type_name(fl.l_type), (long long)fl.l_start, (long long)fl.l_len, (int)fl.l_pid);
                return 1;
            }
        }
        if (r != 0) {
            int e = errno;
            if (busy_errno(e)) {
                if (!quiet) printf("%s: busy (%s)\n", argv[i], strerror(e));
                return 1;
            }
            fprintf(stderr, "vfsd-lock: %s on %s: %s\n", argv[i], path, strerror(e));
            return 2;
        }
    }
    if (test)
        return 0;
    if (!quiet) printf("granted after %.3fs\n", mono() - t0);
    if (marker && touch(marker) != 0) return 2;
    if (until) {
        while (access(until, F_OK) != 0)
            sleep_s(0.01);
    }
    if (hold > 0) sleep_s(hold);
    if (stamp && touch(stamp) != 0) return 2;
    close(fd);   /* releases the POSIX, OFD and flock locks */
    return 0;
}
