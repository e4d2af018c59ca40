#include <spdlog/spdlog.h>

#include "dist/communicator.h"
#include "model/config.h"
#include "tools/commands.h"
#include "train/preempt.h"
#include "train/trainer.h"

namespace llmt::cli {

int train(const TrainArgs& args) {
  const Config config = load_config(args.config, args.set);
  const std::string out = args.out.empty() ? "runs/" + config.run_name : args.out;
  // One process per rank, started by mpirun or srun (docs/DISTRIBUTED.md); a plain start is rank 0 of 1.
  const std::unique_ptr<Communicator> comm = make_communicator(config.train.backend);
  if (comm->rank() != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 reports progress
  install_preemption_handlers();
  try {
    spdlog::info("run {} -> {}", config.run_name, out);
    Trainer trainer(config, out, args.resume, *comm);
    if (trainer.run() == Trainer::RunEnd::preempted) return preempted_exit_code();
    spdlog::info("done: {} steps, {} tokens; metrics in {}/metrics.jsonl", trainer.state().step,
                 trainer.state().tokens, out);
  } catch (const std::exception& e) {
    if (comm->world_size() == 1) throw;
    // The other ranks may be waiting in a collective: report here, then end them all.
    spdlog::error("rank {}: {}", comm->rank(), e.what());
    comm->abort(2);
  }
  return 0;
}

}  // namespace llmt::cli
