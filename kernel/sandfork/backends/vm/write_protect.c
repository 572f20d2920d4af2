/*
 * Preloaded into QEMU (LD_PRELOAD) so the engine can tell which guest pages were written
 * since its last look, at the cost of those pages only.
 *
 * When QEMU maps the memory image named by $SANDFORK_TRACK_IMAGE, the mapping is registered
 * with a userfaultfd in asynchronous write-protect mode: the kernel resolves every write
 * fault itself (no thread here handles anything) and only clears the page's write-protect
 * bit. The engine then asks the kernel, from its own process, for the pages written since
 * its previous question and protects them again in the same call: ioctl(PAGEMAP_SCAN) on
 * /proc/<QEMU's pid>/pagemap (backends/vm/write_tracking.py). Needs Linux 6.7 or later.
 *
 * Nothing else of QEMU changes. If the registration fails, one line in QEMU's log says why
 * and the engine, finding the mapping unregistered, compares pages as before.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Newer than Debian 12's kernel headers. */
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif

static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static struct stat image;
static int wanted; /* 1 until the image is registered (or its registration failed) */

__attribute__((constructor)) static void init(void) {
    const char *path = getenv("SANDFORK_TRACK_IMAGE");
    next_mmap = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
    /* Inherited by the programs QEMU is started through (chrt, nice) and by those it runs
     * (cat): none of them maps the image, so the registration happens in QEMU alone. */
    wanted = path != NULL && stat(path, &image) == 0;
}

static int open_userfaultfd(void) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == EPERM) /* vm.unprivileged_userfaultfd = 0: user faults only */
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    return fd;
}

static void track(void *start, size_t length) {
    struct uffdio_api api = {
        .api = UFFD_API,
        .features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
    };
    struct uffdio_register range = {
        .range = {.start = (unsigned long)start, .len = length},
        .mode = UFFDIO_REGISTER_MODE_WP,
    };
    const char *step = "userfaultfd";
    int fd = open_userfaultfd();
    if (fd >= 0) {
        step = "UFFDIO_API";
        if (ioctl(fd, UFFDIO_API, &api) == 0) {
            step = "UFFDIO_REGISTER";
            if (ioctl(fd, UFFDIO_REGISTER, &range) == 0)
                return; /* fd stays open: closing it would end the registration */
        }
    }
    fprintf(stderr, "sandfork: guest page tracking off (%s: %s)\n", step, strerror(errno));
    if (fd >= 0)
        close(fd);
}

void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    void *mapped = next_mmap(addr, length, prot, flags, fd, offset);
    struct stat st;
    if (wanted && mapped != MAP_FAILED && fd >= 0 && fstat(fd, &st) == 0 &&
        st.st_dev == image.st_dev && st.st_ino == image.st_ino) {
        int saved = errno;
        wanted = 0;
        track(mapped, length);
        errno = saved;
    }
    return mapped;
}

void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
    __attribute__((alias("mmap")));
