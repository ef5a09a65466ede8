#include "stop_signals.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>

namespace iha::app {
namespace {

constexpr int kStopSignals[] = {SIGUSR1, SIGUSR2, SIGTERM, SIGINT};

volatile std::sig_atomic_t g_received = 0;

// Only async-signal-safe work here: a flag, or _exit for the second signal.
extern "C" void on_stop_signal(int sig) {
  if (g_received != 0) _exit(128 + sig);
  g_received = sig;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);  // two at once still count as two
  // Blocking calls (MPI progress, file writes) resume instead of failing with EINTR.
  sa.sa_flags = SA_RESTART;
  for (int s : kStopSignals) sigaction(s, &sa, nullptr);
  // A stop signal blocked by whoever started us (a launcher's mask survives exec) would never
  // stop the run; one already pending is delivered here, during start-up, and counts.
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : kStopSignals) sigaddset(&stop, s);
  sigprocmask(SIG_UNBLOCK, &stop, nullptr);
}

void default_stop_handlers() {
  for (int s : kStopSignals) std::signal(s, SIG_DFL);
  if (g_received != 0) std::raise(g_received);  // what the default would have done on arrival
}

int agree_on_stop(Communicator& world) {
  int64_t sig = g_received;
  world.all_reduce(&sig, 1, DType::i64, ReduceOp::max, "train.stop_signal");
  return static_cast<int>(sig);
}

namespace {

// From the executable's .preinit_array: the dynamic loader runs it before the initialisers
// of every shared library (OpenBLAS starts its threads there, MPI's and HDF5's run too) and
// long before main, which on a loaded machine is 100 ms or more after exec. A stop signal
// that arrives in that time would otherwise kill the rank (exit 138 for SIGUSR1) instead of
// stopping it with code 4. Only the loader's own relocation precedes it.
void install_stop_handlers_at_preinit(int, char**, char**) { install_stop_handlers(); }

}  // namespace

__attribute__((section(".preinit_array"), used)) static void (*const kPreinitStopHandlers)(int, char**, char**) =
    install_stop_handlers_at_preinit;

const char* signal_name(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: {
      static thread_local char buf[24];
      std::snprintf(buf, sizeof buf, "signal %d", sig);
      return buf;
    }
  }
}

}  // namespace iha::app
