#pragma once
// Where a result came from: the commit the binary was built from, the host, the time.
#include <string>
#include <vector>

namespace actbench {

const char* build_git_sha();
std::string hostname();
std::string utc_timestamp();  // ISO 8601, e.g. 2026-11-22T14:03:00Z
std::string joined_command_line(int argc, char** argv);

}  // namespace actbench
