// Graceful stop of iha-train on the signals batch systems send before they kill a job
// (docs/training.md, "Signals and preemption").
//
//   install_stop_handlers();                 // before main (.preinit_array), first thing in main (a signal during start-up
//                                            // is a stop too), and again after MPI_Init (MPI
//                                            // may install its own)
//   while (...) { if (int sig = agree_on_stop(world)) { save; return kExitStopped; } step(); }
//
// The first SIGUSR1, SIGUSR2, SIGTERM or SIGINT a rank receives only records the signal; the
// ranks agree on it at the next step boundary with one all-reduce, so every rank stops after
// the same step, even when only some ranks were signalled. A second one of these signals to
// the same process ends it at once with _exit(128 + signal): no checkpoint is started, nothing
// is flushed, and `latest` keeps naming the last committed checkpoint (a save cut short leaves
// only a temporary directory, which the checkpoint root's recovery removes).
// defines: iha::app::kExitStopped, iha::app::install_stop_handlers, iha::app::default_stop_handlers,
//          iha::app::agree_on_stop,
//          iha::app::signal_name
#pragma once

#include "parallel/comm.h"

namespace iha::app {

// Exit code of a run stopped by a signal after it saved a checkpoint at a step boundary.
constexpr int kExitStopped = 4;

void install_stop_handlers();
// For commands that save nothing (eval, check): the default actions again, and a signal
// recorded during start-up acts now as it would have on arrival.
void default_stop_handlers();
// Collective over world (one all-reduce of one integer): the stop signal any rank has received
// so far (the largest signal number if several), 0 if none. The same value on every rank.
int agree_on_stop(Communicator& world);
// "SIGUSR1", ... for the stop signals; "signal N" otherwise.
const char* signal_name(int sig);

}  // namespace iha::app
