/* A check-then-open race made deterministic for the fault suite (test_hostile_commands.cpp),
 * loaded with LD_PRELOAD: the first open by name of the path $IHA_SWAP_TO_FIFO in this process
 * (open, open64, openat, openat64, fopen, fopen64) first moves that file to PATH.orig and puts
 * a FIFO in its place, then opens. A tool that checked the path by stat and then opened it by
 * name would block on the FIFO (no writer); one that checks the descriptor it opened refuses
 * it. stat is not intercepted: the check sees the regular file, as in the race. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int swapped = 0;

static void maybe_swap(const char* path) {
  const char* target = getenv("IHA_SWAP_TO_FIFO");
  if (swapped || !target || !*target || !path || strcmp(path, target) != 0) return;
  swapped = 1;
  char orig[PATH_MAX];
  snprintf(orig, sizeof orig, "%s.orig", target);
  if (rename(target, orig) == 0) mkfifo(target, 0600);
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN_HOOK(name)                                                   \
  int name(const char* path, int flags, ...) {                            \
    va_list ap;                                                           \
    va_start(ap, flags);                                                  \
    const mode_t mode = mode_arg(flags, ap);                              \
    va_end(ap);                                                           \
    maybe_swap(path);                                                     \
    int (*real)(const char*, int, ...) = dlsym(RTLD_NEXT, #name);         \
    return real(path, flags, mode);                                       \
  }
OPEN_HOOK(open)
OPEN_HOOK(open64)

#define OPENAT_HOOK(name)                                                 \
  int name(int dirfd, const char* path, int flags, ...) {                 \
    va_list ap;                                                           \
    va_start(ap, flags);                                                  \
    const mode_t mode = mode_arg(flags, ap);                              \
    va_end(ap);                                                           \
    maybe_swap(path);                                                     \
    int (*real)(int, const char*, int, ...) = dlsym(RTLD_NEXT, #name);    \
    return real(dirfd, path, flags, mode);                                \
  }
OPENAT_HOOK(openat)
OPENAT_HOOK(openat64)

#define FOPEN_HOOK(name)                                                  \
  FILE* name(const char* path, const char* how) {                         \
    maybe_swap(path);                                                     \
    FILE* (*real)(const char*, const char*) = dlsym(RTLD_NEXT, #name);    \
    return real(path, how);                                               \
  }
FOPEN_HOOK(fopen)
FOPEN_HOOK(fopen64)
