#pragma once
// How layer_run's ranks agree under mpirun: every check is collective, so that all ranks stop
// together, with one line on stderr and the same exit status, whatever rank found the problem.
// One process: checks just run. Exit statuses: 0 ok, 2 bad input, 3 out of memory, 1 any
// other failure.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runners/experiment.hpp"
#include "runners/layer_run_options.hpp"
#include "runtime/communicator.hpp"

namespace actbench {

// How a failure is reported: its exit status and its one line.
struct Failure {
  int code = 0;  // 0: none
  std::string line;
};

// The exception being handled, as a Failure (call inside a catch block).
Failure current_failure();

// Every rank has agreed to stop with this status; the one line is already printed.
struct AgreedExit {
  int code;
};

// The verdicts of one run.
class Verdicts {
 public:
  explicit Verdicts(Communicator* world) : world_(world) {}

  // Runs `check` on this rank, then every rank learns whether it failed anywhere (a failure
  // anywhere: AgreedExit on every rank).
  template <class F>
  void check(F&& check) {
    if (!world_) return check();
    Failure mine;
    try {
      check();
    } catch (...) {
      mine = current_failure();
    }
    offer(mine);
  }

  // Ranks given different arguments would run different collectives and wait for each
  // other forever: compare every option (name, canonical value), name the first that differs.
  void same_arguments(const std::vector<std::pair<std::string, std::string>>& options);

  // Out of memory is recorded in the row when every rank ran out at the same point (the
  // ranks are alike, so they do). A rank that ran out alone has left peers waiting in a
  // collective: it offers its verdict for a few seconds, then ends the job.
  void same_status(ExperimentResult& r);

  // The run's exit status, the same on every rank.
  int exit_code(int mine);

 private:
  void offer(const Failure& mine);
  Communicator* world_;
};

// The exit status of a failure outside an agreed check (call inside a catch block): under
// mpirun the peers may be waiting in a collective for this rank. It offers the verdict for a
// few seconds (peers that failed at the same point, or are at their next check, take it and
// all stop cleanly); else it ends every rank.
int fail(Communicator* world);

// Each option as a canonical string, for same_arguments (0.1 and 0.10 are the same value).
std::vector<std::pair<std::string, std::string>> normalized(const LayerRunOptions& o);

}  // namespace actbench
