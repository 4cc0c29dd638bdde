// main() of the simulator's test binaries: GoogleTest's flags, then the simulator's own
// (--cudasim-schedule=rr|greedy|random[:seed], --cudasim-device=h100|a100|sm86), which ctest
// passes to run the same tests under another schedule.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cudasim/sim.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--cudasim-schedule=", 0) == 0) {
      const std::string v = a.substr(19);
      if (v == "rr") cudasim::set_schedule(cudasim::Schedule::round_robin);
      else if (v == "greedy") cudasim::set_schedule(cudasim::Schedule::greedy);
      else if (v.rfind("random", 0) == 0)
        cudasim::set_schedule(cudasim::Schedule::random, v.size() > 7 ? std::strtoull(v.c_str() + 7, nullptr, 10) : 1);
      else {
        std::fprintf(stderr, "error: unknown schedule %s (rr, greedy, random[:seed])\n", v.c_str());
        return 2;
      }
    } else if (a.rfind("--cudasim-device=", 0) == 0) {
      const std::string v = a.substr(17);
      if (v == "h100") cudasim::set_device(cudasim::DeviceModel::h100);
      else if (v == "a100") cudasim::set_device(cudasim::DeviceModel::a100);
      else if (v == "sm86") cudasim::set_device(cudasim::DeviceModel::sm86);
      else {
        std::fprintf(stderr, "error: unknown device %s (h100, a100, sm86)\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "error: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("cudasim: schedule %s, device %s\n", cudasim::schedule_name(cudasim::schedule()),
              cudasim::device_name(cudasim::device()));
  return RUN_ALL_TESTS();
}
