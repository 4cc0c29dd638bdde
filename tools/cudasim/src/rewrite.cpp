// cudasim_rewrite IN OUT: copies a CUDA source for the simulator, rewriting exactly two
// constructs that a host compiler cannot parse, without changing any line number:
//   kernel<<<grid, block, smem, stream>>>(args)
//     -> ::cudasim::launcher(__FILE__, __LINE__, "kernel", kernel, grid, block, smem, stream)(args)
//   extern __shared__ T name[];
//     -> T* const name = static_cast<T*>(::cudasim::dynamic_shared());
// The output starts with `#line 1 "IN"`, so every diagnostic and every simulator report names
// the original file and line. Comments, string and character literals are left alone.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::cerr << "cudasim_rewrite: error: " << msg << "\n";
  std::exit(1);
}

// code[i] is true where text[i] is program text (not a comment or literal).
std::vector<bool> code_mask(const std::string& s) {
  std::vector<bool> code(s.size(), true);
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 2, "//") == 0) {
      while (i < s.size() && s[i] != '\n') code[i++] = false;
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t end = s.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? s.size() : end + 2;
      while (i < stop) code[i++] = false;
    } else if (s[i] == '"' || s[i] == '\'') {
      const char q = s[i];
      code[i++] = false;
      while (i < s.size() && s[i] != q) {
        if (s[i] == '\\') code[i++] = false;
        if (i < s.size()) code[i++] = false;
      }
      if (i < s.size()) code[i++] = false;
    } else {
      ++i;
    }
  }
  return code;
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

int line_of(const std::string& s, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos; ++i) line += s[i] == '\n';
  return line;
}

struct Edit {
  size_t pos, len;
  std::string text;
};

// Start of the kernel expression that ends right before `end` (exclusive): an id-expression
// with optional template arguments and `::` qualifiers.
size_t kernel_start(const std::string& s, size_t end, const std::string& path) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  for (;;) {
    if (i > 0 && s[i - 1] == '>') {  // template arguments
      int depth = 0;
      do {
        --i;
        if (s[i] == '>') ++depth;
        if (s[i] == '<') --depth;
      } while (i > 0 && depth > 0);
      if (depth != 0) die(path + ":" + std::to_string(line_of(s, end)) + ": unbalanced <> before <<<");
    }
    const size_t id_end = i;
    while (i > 0 && ident_char(s[i - 1])) --i;
    if (i == id_end) die(path + ":" + std::to_string(line_of(s, end)) + ": no kernel name before <<<");
    if (i >= 2 && s[i - 1] == ':' && s[i - 2] == ':') {
      i -= 2;
      continue;
    }
    return i;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: cudasim_rewrite IN OUT");
  const std::string in_path = argv[1], out_path = argv[2];
  std::ifstream in(in_path, std::ios::binary);
  if (!in) die("cannot read " + in_path);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string src = buf.str();
  const std::vector<bool> code = code_mask(src);

  std::vector<Edit> edits;
  int launches = 0;
  for (size_t i = 0; i + 3 <= src.size(); ++i) {
    if (!code[i] || src.compare(i, 3, "<<<") != 0) continue;
    const size_t start = kernel_start(src, i, in_path);
    std::string expr = src.substr(start, i - start);
    while (!expr.empty() && std::isspace(static_cast<unsigned char>(expr.back()))) expr.pop_back();
    std::string name;  // the kernel expression as a string literal, whitespace collapsed
    for (char c : expr) name += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
    size_t close = i + 3;
    while (close + 3 <= src.size() && !(code[close] && src.compare(close, 3, ">>>") == 0)) ++close;
    if (close + 3 > src.size()) die(in_path + ":" + std::to_string(line_of(src, i)) + ": <<< without >>>");
    edits.push_back({start, 0, "::cudasim::launcher(__FILE__, __LINE__, \"" + name + "\", "});
    edits.push_back({i, 3, ", "});
    edits.push_back({close, 3, ")"});
    ++launches;
    i = close + 2;
  }

  // extern __shared__ [__align__(n)] TYPE NAME[];  (one line)
  const std::regex smem_re(R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:<>\s]*?)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;)");
  for (std::sregex_iterator it(src.begin(), src.end(), smem_re), e; it != e; ++it) {
    const size_t pos = static_cast<size_t>(it->position(0));
    if (!code[pos]) continue;
    const std::string type = (*it)[1].str(), name = (*it)[2].str();
    edits.push_back({pos, static_cast<size_t>(it->length(0)),
                     type + "* const " + name + " = static_cast<" + type + "*>(::cudasim::dynamic_shared());"});
  }
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.pos < b.pos; });

  std::string out = "#line 1 \"" + in_path + "\"\n";
  size_t at = 0;
  for (const Edit& e : edits) {
    if (e.pos < at) die(in_path + ": overlapping rewrites near line " + std::to_string(line_of(src, e.pos)));
    out.append(src, at, e.pos - at);
    out += e.text;
    at = e.pos + e.len;
  }
  out.append(src, at, std::string::npos);

  // Write only when changed: the kernel objects do not rebuild for nothing.
  std::ifstream old(out_path, std::ios::binary);
  if (old) {
    std::stringstream ob;
    ob << old.rdbuf();
    if (ob.str() == out) return 0;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path(), ec);
  std::ofstream o(out_path, std::ios::binary | std::ios::trunc);
  if (!o || !(o << out)) die("cannot write " + out_path);
  (void)launches;
  return 0;
}
