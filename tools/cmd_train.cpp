#include <spdlog/spdlog.h>

#include "model/config.h"
#include "tools/commands.h"
#include "train/trainer.h"

namespace llmt::cli {

int train(const TrainArgs& args) {
  const Config config = load_config(args.config, args.set);
  const std::string out = args.out.empty() ? "runs/" + config.run_name : args.out;
  spdlog::info("run {} -> {}", config.run_name, out);
  Trainer trainer(config, out, args.resume);
  trainer.run();
  spdlog::info("done: {} steps, {} tokens; metrics in {}/metrics.jsonl", trainer.state().step, trainer.state().tokens,
               out);
  return 0;
}

}  // namespace llmt::cli
