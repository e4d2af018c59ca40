// Preemption (docs/PREEMPTION.md): SIGTERM or SIGUSR1 asks the trainer to finish the current
// step, write a checkpoint and exit with kPreemptedExitCode; a second signal ends the process
// at once (exit code 128 + the signal number, as if killed by it), except the same signal again
// within 1 s: one request delivered twice, as timeout(1) and Slurm do (the process and its group).
#pragma once

namespace llmt {

/// Exit code of a run stopped by a preemption signal after writing its checkpoint:
/// 75 = EX_TEMPFAIL (sysexits.h), "try again later": resume the run with --resume.
constexpr int kPreemptedExitCode = 75;

/// Installs the SIGTERM and SIGUSR1 handlers (idempotent).
void install_preemption_handlers();

/// Whether a preemption signal has arrived since the handlers were installed.
bool preemption_requested();

}  // namespace llmt
