/* Fault injection for the fault suite (test_faults.cpp), loaded with LD_PRELOAD: write(2) and
 * pwrite(2) to a file whose path contains $IHA_ENOSPC_PATH fail with ENOSPC once
 * $IHA_ENOSPC_AFTER bytes (default 0) have been written to such files by this process: a disk
 * that fills up at a chosen point, where no small tmpfs can be mounted, or to hit one writer
 * (e.g. HDF5's metadata writes) exactly. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static long long written_so_far = 0;

static int targeted(int fd, size_t n) {
  const char* want = getenv("IHA_ENOSPC_PATH");
  if (!want || !*want || n == 0) return 0;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t len = readlink(link, path, sizeof path - 1);
  if (len <= 0) return 0;
  path[len] = '\0';
  if (!strstr(path, want)) return 0;
  const char* after = getenv("IHA_ENOSPC_AFTER");
  const long long budget = after ? atoll(after) : 0;
  if (written_so_far + (long long)n <= budget) {
    written_so_far += (long long)n;
    return 0;
  }
  return 1;
}

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  if (targeted(fd, n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (targeted(fd, n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
