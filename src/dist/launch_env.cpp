#include "dist/launch_env.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace llmt {

namespace {

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  check(*value != '\0' && *end == '\0' && v >= 0 && v <= 1 << 30,
        "launch environment: {}=\"{}\" is not a non-negative integer", name, value);
  return static_cast<int>(v);
}

}  // namespace

LaunchEnv detect_launch_env(const std::function<const char*(const char*)>& getenv) {
  const auto get = [&](const char* name) { return getenv ? getenv(name) : std::getenv(name); };
  struct Vars {
    const char *source, *rank, *size, *local;
  };
  // srun sets SLURM_STEP_NUM_TASKS only inside a job step: a batch script's own shell (one
  // process) is not mistaken for a rank of SLURM_NTASKS.
  const Vars candidates[] = {
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Vars& c : candidates) {
    const char* rank = get(c.rank);
    const char* size = get(c.size);
    if (!rank || !size) continue;
    LaunchEnv env;
    env.source = c.source;
    env.rank = parse_int(c.rank, rank);
    env.world_size = parse_int(c.size, size);
    const char* local = get(c.local);
    env.local_rank = local ? parse_int(c.local, local) : 0;
    check(env.world_size >= 1 && env.rank < env.world_size, "launch environment ({}): {}={} is outside [0, {}={})",
          c.source, c.rank, env.rank, c.size, env.world_size);
    return env;
  }
  return LaunchEnv{};
}

}  // namespace llmt
