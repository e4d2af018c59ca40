// The rank, world size and local rank that a launcher gives a process through its environment
// (issue 8: processes are started by mpirun or srun, never by the trainer). Read before MPI is
// initialised, so that a run of one process needs no MPI at all.
#pragma once
#include <functional>
#include <string>

namespace llmt {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string source;  ///< the launcher recognised: "openmpi", "slurm", "pmi" or "" (none)
};

/// Reads, in this order of precedence:
///   Open MPI (mpirun):    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
///   Slurm (srun):         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (when SLURM_PROCID is set)
///   PMI (MPICH, Hydra):   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
/// and returns world size 1 when none is set. `getenv` returns nullptr for an unset variable
/// (std::getenv by default; tests pass their own). Throws llmt::Error naming the variable when a
/// value is not an integer or the rank is outside [0, world size).
LaunchEnv detect_launch_env(const std::function<const char*(const char*)>& getenv = nullptr);

}  // namespace llmt
