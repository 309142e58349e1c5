// What one config key's value may be on its own (the limits column of src/config/keys.def): a
// range, a set of values, or text that is not empty. The rules between keys are validate_config's
// (src/config/validate.cpp).
#pragma once

#include <string>
#include <vector>

namespace trainer {

// A range of numbers: its ends, each open or closed (high = infinity: no upper end).
struct LimitsRange {
  double low = 0, high = 0;
  bool low_open = false, high_open = false;
  bool zero_too = false;  // 0 (off) besides the range
};

class Limits {
 public:
  enum class Kind { kAny, kRange, kOneOf, kNonEmpty };
  using Range = LimitsRange;
  Limits(Kind kind, std::string note, Range range = {}, std::vector<double> values = {});

  bool is_any() const { return kind_ == Kind::kAny; }
  // A number is allowed when it is finite and within the range (or one of the values); no key
  // takes NaN or infinity.
  bool allows(double value) const;
  bool allows(const std::string& text) const;
  // The rule as --help shows it and an error says it after "must be": ">= 1", "in [0, 1)",
  // "0 or >= 32", "3, 4 or 8", "non-empty"; "" for any value.
  std::string rule() const;
  // What a value means, given with the rule in errors: "0: off".
  const std::string& note() const { return note_; }

 private:
  Kind kind_;
  std::string note_;
  Range range_;
  std::vector<double> values_;
};

// The limits that the entries of src/config/keys.def name; its includers bring them in with a
// using-directive.
namespace limits {
Limits any();
Limits at_least(double low, std::string note = "");
Limits above(double low, std::string note = "");
Limits in(double low, double high, std::string note = "");             // [low, high]
Limits in_right_open(double low, double high, std::string note = "");  // [low, high)
Limits in_open(double low, double high, std::string note = "");        // (low, high)
Limits off_or_at_least(double low, std::string note = "");             // 0, or >= low
Limits one_of(std::vector<double> values, std::string note = "");
Limits non_empty(std::string note = "");
}  // namespace limits

}  // namespace trainer
