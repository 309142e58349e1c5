// Each config key's own limits (src/config/limits.h): what they allow, how --help and the error
// say them, and that every key of the table is bound to the command line with them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "src/config/config.h"
#include "src/config/limits.h"

// Inside limits itself: a using-directive here would reach the files compiled after this one
// in its unity batch.
namespace trainer::limits {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ConfigLimits, RangesKeepTheirEnds) {
  EXPECT_TRUE(at_least(1).allows(1));
  EXPECT_FALSE(at_least(1).allows(0.999));
  EXPECT_FALSE(above(0).allows(0));
  EXPECT_TRUE(above(0).allows(1e-12));
  EXPECT_TRUE(in(1, 64).allows(64));
  EXPECT_FALSE(in(1, 64).allows(65));
  EXPECT_TRUE(in_right_open(0, 1).allows(0));
  EXPECT_FALSE(in_right_open(0, 1).allows(1));
  EXPECT_FALSE(in_open(0, 1).allows(0));
  EXPECT_FALSE(in_open(0, 1).allows(1));
  EXPECT_TRUE(off_or_at_least(32).allows(0));
  EXPECT_FALSE(off_or_at_least(32).allows(16));
  EXPECT_TRUE(off_or_at_least(32).allows(32));
  EXPECT_TRUE(one_of({3, 4, 8}).allows(8));
  EXPECT_FALSE(one_of({3, 4, 8}).allows(5));
}

TEST(ConfigLimits, NoLimitedNumberIsNanOrInfinite) {
  for (const Limits& limits : {at_least(0), above(0), off_or_at_least(32), one_of({3})}) {
    EXPECT_FALSE(limits.allows(kNan)) << limits.rule();
    EXPECT_FALSE(limits.allows(kInf)) << limits.rule();
  }
  EXPECT_TRUE(any().allows(kNan));
}

TEST(ConfigLimits, TextMayBeRequired) {
  EXPECT_FALSE(non_empty().allows(std::string()));
  EXPECT_TRUE(non_empty().allows(std::string("auto")));
  EXPECT_TRUE(any().allows(std::string()));
}

TEST(ConfigLimits, RulesReadAsHelpSaysThem) {
  EXPECT_EQ(at_least(1).rule(), ">= 1");
  EXPECT_EQ(above(0).rule(), "> 0");
  EXPECT_EQ(in(1, 1024).rule(), "in [1, 1024]");
  EXPECT_EQ(in_right_open(0, 1).rule(), "in [0, 1)");
  EXPECT_EQ(in_open(0, 1).rule(), "in (0, 1)");
  EXPECT_EQ(off_or_at_least(32).rule(), "0 or >= 32");
  EXPECT_EQ(one_of({3, 4, 8}).rule(), "3, 4 or 8");
  EXPECT_EQ(non_empty().rule(), "non-empty");
  EXPECT_EQ(any().rule(), "");
  EXPECT_EQ(at_least(0, "0: off").note(), "0: off");
}

// The message `train --key value` stops with, or "" when it is accepted.
std::string error_of(const std::string& key, const std::string& value) {
  const std::string flag = "--" + key;
  const std::vector<const char*> argv = {"train", flag.c_str(), value.c_str()};
  try {
    const auto line = parse_command_line(static_cast<int>(argv.size()), argv.data());
    validate_config(line->config);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigLimits, AKeyOutsideItsLimitsIsRefusedWithTheRuleAndWhatValuesMean) {
  EXPECT_EQ(error_of("profile_steps", "-1"),
            "config key 'profile_steps' = -1 is invalid: must be >= 0 (0: none)");
  EXPECT_EQ(error_of("reader_threads", "65"),
            "config key 'reader_threads' = 65 is invalid: must be in [1, 64]");
  EXPECT_EQ(error_of("output_dir", ""),
            "config key 'output_dir' = '' is invalid: must be non-empty");
  EXPECT_EQ(error_of("reader_threads", "64"), "");
}

TEST(ConfigLimits, HelpShowsEachKeysRuleAndEachChoiceKeysValues) {
  const std::string reference = config_reference_markdown();
  EXPECT_NE(reference.find("| `reader_threads` | `2` | tfrecord: file reader threads per rank "
                           "(in [1, 64]) |"),
            std::string::npos)
      << reference;
  EXPECT_NE(reference.find("(fp32 \\| fp16 \\| bf16)"), std::string::npos) << reference;
}

}  // namespace
}  // namespace trainer::limits
