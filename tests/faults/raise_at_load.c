/* Preloaded into iha-train by HostileCommandsRound3.AStopSignalWhileLibrariesLoadEndsWithCodeFour:
 * raises SIGUSR1 from a shared library's initialiser, i.e. while the dynamic loader is still
 * starting the program, long before main. Only in a process named iha-train (the shell and
 * env that start it load it too). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>

__attribute__((constructor)) static void raise_stop_signal_at_load(void) {
  if (strcmp(program_invocation_short_name, "iha-train") == 0) raise(SIGUSR1);
}
