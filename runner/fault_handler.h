// Process-wide fault handling of xfuser-run and xfuser (docs/errors.md, "Faults"):
//
//  * SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: the handler write()s one line naming the rank and
//    the signal plus a raw backtrace to stderr, restores the default action and re-raises the
//    signal. MPI_Abort is not async-signal-safe (it takes locks and allocates), so it is never
//    called from the handler: the process dies by the signal, and mpirun (which watches every
//    rank) ends the whole job on a rank's abnormal death. Tested in tests/test_faults.cpp.
//  * std::terminate (an exception escaping a thread, noexcept violations): logs the exception and
//    ends the job with MPI_Abort (normal context, so MPI may be called).
//  * SIGTERM, SIGINT: the first one sets a stop flag; the run stops after the current denoising
//    step (check_stop_requested() from the step callback throws xfuser::Error), keeps every
//    completed output (all writes are atomic) and exits non-zero; a multi-rank job is then ended
//    with MPI_Abort, so every rank exits non-zero. A second signal kills the process at once.
//  * Parent watchdog (multi-rank runs): a thread checks every 0.5 s that the launcher (mpirun or
//    its orted) is still this process's parent; when the launcher dies (SIGKILL), the rank exits
//    instead of running or waiting on alone.
#pragma once

#include <string>

namespace xfuser::runner {

// Installs the handlers above. `rank` is printed in the messages (-1: not known yet; call again
// once it is). Idempotent.
void install_fault_handlers(int rank);

// Starts the parent watchdog thread (call once MPI is up, on multi-rank runs).
void start_parent_watchdog();

// The stop signal received (SIGTERM or SIGINT), 0 when none.
int stop_signal();

// What the first stop signal's message says it does, for a program that handles the stop its own
// way (`xfuser serve` drains); `meaning` must live for the process. Default: stopping after the
// current step.
void set_stop_meaning(const char* meaning);

// Throws xfuser::Error "stopped by SIGTERM <where>" when a stop signal arrived.
void check_stop_requested(const std::string& where);

// For tests: clears the stop flag.
void reset_stop_request();

}  // namespace xfuser::runner
