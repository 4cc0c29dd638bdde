// actbench_facts: prints runners/facts.json (the presets, configurations, attention modes,
// architectures and the CSV field limit the Python scripts read), writes it, or checks that a
// committed copy is current.
//   actbench_facts                 the JSON on stdout
//   actbench_facts --out FILE      writes FILE (the update_facts target)
//   actbench_facts --check FILE    exit 1, naming the first differing line, when FILE is stale
// A FILE that is not a regular file (a folder, a FIFO) is refused: exit 2, one line.
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <string>

#include "runners/facts_json.hpp"
#include "runtime/csv.hpp"
#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace {

constexpr const char* kRegenerate = "cmake --build build --target update_facts";

// "line N: committed `...`, generated `...`" for the first line where a and b differ.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream in_a(a), in_b(b);
  std::string line_a, line_b;
  for (int n = 1;; ++n) {
    const bool more_a = static_cast<bool>(std::getline(in_a, line_a));
    const bool more_b = static_cast<bool>(std::getline(in_b, line_b));
    if (!more_a && !more_b) return "the last line's newline differs";
    if (!more_a) line_a = "(end of file)";
    if (!more_b) line_b = "(end of file)";
    if (line_a != line_b)
      return "line " + std::to_string(n) + ": committed `" + line_a + "`, generated `" + line_b + "`";
  }
}

int check(const std::string& path) {
  actbench::check_user_file("--check " + path, path, false);
  if (::access(path.c_str(), F_OK) != 0) {
    std::cerr << "actbench_facts: " << path << " cannot be read; generate it: " << kRegenerate << "\n";
    return 1;
  }
  const std::string committed = actbench::read_user_file("--check " + path, path), generated = actbench::facts_json();
  if (committed == generated) return 0;
  std::cerr << "actbench_facts: " << path << " is stale (" << first_difference(committed, generated)
            << "); regenerate it: " << kRegenerate << "\n";
  return 1;
}

int write(const std::string& path) {
  actbench::check_user_file("--out " + path, path, false);
  actbench::write_file_atomic(path, actbench::facts_json());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string option = argc > 1 ? argv[1] : "";
  if (argc == 1) {
    std::cout << actbench::facts_json();
    return 0;
  }
  try {
    if (argc == 3 && option == "--out") return write(argv[2]);
    if (argc == 3 && option == "--check") return check(argv[2]);
  } catch (const actbench::InvalidArgument& e) {
    std::cerr << "actbench_facts: error: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "actbench_facts: error: usage: actbench_facts [--out FILE | --check FILE]\n";
  return 2;
}
