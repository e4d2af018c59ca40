// Preemption (docs/PREEMPTION.md): SIGTERM or SIGUSR1 asks the trainer to finish the current
// step, write a checkpoint and exit with kPreemptedExitCode; SIGINT (Ctrl-C) does the same and
// exits with kInterruptedExitCode. A second signal ends the process at once (exit code 128 + the
// signal number, as if killed by it), except the same signal again within 1 s: one request
// delivered twice, as timeout(1), Slurm and a terminal do (the process and its group).
#pragma once

namespace llmt {

/// Exit code of a run stopped by a preemption signal after writing its checkpoint:
/// 75 = EX_TEMPFAIL (sysexits.h), "try again later": resume the run with --resume.
constexpr int kPreemptedExitCode = 75;

/// Exit code of a run stopped by SIGINT (Ctrl-C) after writing its checkpoint: 130 = 128 + SIGINT,
/// what a shell reports for a command ended by Ctrl-C (llmtrain sweep then stops too); --resume continues it.
constexpr int kInterruptedExitCode = 130;

/// Installs the SIGTERM, SIGUSR1 and SIGINT handlers (idempotent). SIGINT is left alone where it is ignored
/// at the call (nohup, or a background job of a non-interactive shell): such a run does not stop on Ctrl-C.
void install_preemption_handlers();

/// Whether a preemption signal (SIGTERM, SIGUSR1 or SIGINT) has arrived since the handlers were installed.
bool preemption_requested();

/// The first such signal received (SIGTERM, SIGUSR1 or SIGINT), 0 if none.
int preemption_signal();

/// The exit code of a run that stopped with a checkpoint on a preemption signal: kInterruptedExitCode where this
/// process's first signal was SIGINT, else kPreemptedExitCode (also on a rank that stopped because another was
/// signalled).
int preempted_exit_code();

}  // namespace llmt
