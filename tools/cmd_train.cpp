#include <spdlog/spdlog.h>

#include "model/config.h"
#include "tools/commands.h"
#include "train/preempt.h"
#include "train/trainer.h"

namespace llmt::cli {

int train(const TrainArgs& args) {
  const Config config = load_config(args.config, args.set);
  const std::string out = args.out.empty() ? "runs/" + config.run_name : args.out;
  spdlog::info("run {} -> {}", config.run_name, out);
  install_preemption_handlers();
  Trainer trainer(config, out, args.resume);
  if (trainer.run() == Trainer::RunEnd::preempted) return kPreemptedExitCode;
  spdlog::info("done: {} steps, {} tokens; metrics in {}/metrics.jsonl", trainer.state().step, trainer.state().tokens,
               out);
  return 0;
}

}  // namespace llmt::cli
