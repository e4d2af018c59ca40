#include "train/preempt.h"

#include <atomic>
#include <csignal>
#include <unistd.h>

namespace llmt {

namespace {

std::atomic<int> g_signal{0};  // the first preemption signal received, 0 = none
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_preemption_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) _exit(128 + sig);  // the second signal: stop now
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool preemption_requested() { return g_signal.load() != 0; }

}  // namespace llmt
