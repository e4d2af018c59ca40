#include "train/preempt.h"

#include <atomic>
#include <csignal>
#include <ctime>
#include <unistd.h>

namespace llmt {

namespace {

std::atomic<int> g_signal{0};            // the first preemption signal received, 0 = none
std::atomic<long long> g_first_ns{0};     // when it arrived (CLOCK_MONOTONIC ns), 0 = not yet stored
constexpr long long kDuplicateNs = 1000000000LL;  // the same signal again within 1 s is the same request
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
static_assert(std::atomic<long long>::is_always_lock_free, "the signal handler needs a lock-free time");

long long monotonic_ns() {  // clock_gettime is async-signal-safe (POSIX.1-2008)
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The first signal sets the flag. The same signal again within kDuplicateNs is one request delivered twice:
// timeout(1) and Slurm signal both the process and its process group. Any other later signal: stop now.
extern "C" void on_preemption_signal(int sig) {
  const long long now = monotonic_ns();
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) {
    g_first_ns.store(now);
    return;
  }
  const long long first = g_first_ns.load();
  if (expected == sig && (first == 0 || now - first < kDuplicateNs)) return;
  _exit(128 + sig);
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  struct sigaction old = {};
  sigaction(SIGINT, nullptr, &old);
  if (old.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, nullptr);
}

bool preemption_requested() { return g_signal.load() != 0; }

int preemption_signal() { return g_signal.load(); }

int preempted_exit_code() { return preemption_signal() == SIGINT ? kInterruptedExitCode : kPreemptedExitCode; }

}  // namespace llmt
