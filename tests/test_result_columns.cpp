// The column tables of layer_run's CSVs (runners/result_columns.hpp) and rows filled by name.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "runners/result_columns.hpp"
#include "runtime/error.hpp"

using namespace actbench;

namespace {

// The message of the RuntimeFailure `f` throws, or "" when nothing was thrown.
template <class F>
std::string failure(F&& f) {
  try {
    f();
  } catch (const RuntimeFailure& e) {
    return e.what();
  }
  return "";
}

const std::vector<Column> kTwo = {{"a", "", "first"}, {"b", "ms", "second"}};

}  // namespace

TEST(ResultColumns, EveryColumnNamedOnceWithAMeaning) {
  for (const auto* table : {&result_columns(), &cupti_columns()}) {
    std::set<std::string> names;
    for (const Column& c : *table) {
      EXPECT_TRUE(names.insert(c.name).second) << c.name << " declared twice";
      EXPECT_NE(std::string(c.meaning), "") << c.name;
      EXPECT_EQ(std::string(c.meaning).find('|'), std::string::npos) << c.name << ": '|' breaks the markdown table";
    }
  }
  EXPECT_EQ(result_columns().size(), 97u);
  EXPECT_EQ(cupti_columns().size(), 23u);
}

TEST(ResultColumns, SchemaListsEveryColumnWithItsUnit) {
  const std::string schema = results_schema_markdown();
  EXPECT_NE(schema.find("| `fwd_ms` | ms | "), std::string::npos);
  EXPECT_NE(schema.find("| `backend` | | "), std::string::npos);
  for (const auto* table : {&result_columns(), &cupti_columns()})
    for (const Column& c : *table) EXPECT_NE(schema.find(std::string("| `") + c.name + "` |"), std::string::npos);
}

TEST(CsvRow, FieldsInTheTablesOrderWhateverTheOrderSet) {
  CsvRow row(kTwo);
  row.set("b", "2");
  row.set("a", "1");
  EXPECT_EQ(row.fields(), (std::vector<std::string>{"1", "2"}));
}

TEST(CsvRow, RefusesUnknownTwiceAndUnset) {
  CsvRow row(kTwo);
  EXPECT_EQ(failure([&] { row.set("c", "x"); }), "no CSV column 'c'");
  row.set("a", "1");
  EXPECT_EQ(failure([&] { row.set("a", "1"); }), "CSV column 'a' set twice");
  EXPECT_EQ(failure([&] { row.fields(); }), "CSV column 'b' not set");
  row.set("b", "");  // empty is a value
  EXPECT_EQ(row.fields(), (std::vector<std::string>{"1", ""}));
}
