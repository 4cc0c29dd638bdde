#include "theory/paper_values.hpp"

namespace actbench::theory::paper {

const std::vector<Table4Row>& table4() {
  static const std::vector<Table4Row> rows = {
      {"baseline", 7.7, 11.9, 19.6, std::nullopt},
      {"sp", 7.2, 11.8, 19.0, -3.0},
      {"full", 7.7, 19.5, 27.2, 39.0},
      {"selective", 7.7, 13.2, 20.9, 7.0},
      {"selective+sp", 7.2, 13.1, 20.3, 4.0},
  };
  return rows;
}

std::optional<Table4Row> table4_row(const std::string& config) {
  for (const auto& r : table4())
    if (r.config == config) return r;
  return std::nullopt;
}

const std::vector<Table5Row>& table5() {
  static const std::vector<Table5Row> rows = {
      {"22b", 1, 1.42, 1.10, 29.0, 41.5, 43.7, std::nullopt},
      {"175b", 1, 18.13, 13.75, 31.8, 51.4, 52.8, std::nullopt},
      {"530b", 1, 49.05, 37.83, 29.7, 56.0, 57.0, std::nullopt},
      {"1t", 1, 94.42, 71.49, 32.1, 56.3, 57.0, std::nullopt},
      {"530b", 8, std::nullopt, 39.15, std::nullopt, 54.2, std::nullopt, 42.1},
  };
  return rows;
}

const std::vector<Figure1Row>& figure1() {
  static const std::vector<Figure1Row> rows = {
      {"22b", 46.2, 59.0, 9.5},
      {"175b", 45.8, 66.7, 11.2},
      {"530b", 31.6, 114.0, 23.2},
      {"1t", 32.9, 131.2, 26.2},
  };
  return rows;
}

const std::vector<Figure7Row>& figure7() {
  static const std::vector<Figure7Row> rows = {
      {"22b", 66.8, 49.4, 16.1, 7.6},
      {"175b", 62.0, 56.5, 18.5, 8.7},
      {"530b", 58.3, 61.9, 20.2, 9.5},
      {"1t", 58.3, 61.9, 20.2, 9.5},
  };
  return rows;
}

const std::vector<Figure8Row>& figure8() {
  static const std::vector<Figure8Row> rows = {
      {"22b", "full", 39.3, 60.8, 40.6},   {"22b", "selective+sp", 36.8, 60.5, 6.7},
      {"175b", "full", 36.8, 63.2, 38.5},  {"175b", "selective+sp", 35.7, 63.8, 4.0},
      {"530b", "full", 34.4, 65.7, 35.2},  {"530b", "selective+sp", 33.3, 66.2, 2.1},
      {"1t", "full", 35.2, 64.9, 36.3},    {"1t", "selective+sp", 34.1, 66.8, 1.8},
  };
  return rows;
}

}  // namespace actbench::theory::paper
