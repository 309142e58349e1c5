#include "src/config/limits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

namespace trainer {
namespace {

std::string text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

Limits::Limits(Kind kind, std::string note, Range range, std::vector<double> values)
    : kind_(kind), note_(std::move(note)), range_(range), values_(std::move(values)) {}

bool Limits::allows(double value) const {
  if (kind_ == Kind::kAny || kind_ == Kind::kNonEmpty) return true;
  if (!std::isfinite(value)) return false;
  if (kind_ == Kind::kOneOf)
    return std::find(values_.begin(), values_.end(), value) != values_.end();
  if (range_.zero_too && value == 0) return true;
  const bool above_low = range_.low_open ? value > range_.low : value >= range_.low;
  const bool below_high = range_.high_open ? value < range_.high : value <= range_.high;
  return above_low && below_high;
}

bool Limits::allows(const std::string& text) const {
  return kind_ != Kind::kNonEmpty || !text.empty();
}

std::string Limits::rule() const {
  switch (kind_) {
    case Kind::kAny:
      return "";
    case Kind::kNonEmpty:
      return "non-empty";
    case Kind::kOneOf: {
      std::string out;
      for (size_t i = 0; i < values_.size(); ++i)
        out += (i == 0 ? "" : i + 1 == values_.size() ? " or " : ", ") + text(values_[i]);
      return out;
    }
    case Kind::kRange:
      break;
  }
  const std::string zero = range_.zero_too ? "0 or " : "";
  if (std::isinf(range_.high)) return zero + (range_.low_open ? "> " : ">= ") + text(range_.low);
  return zero + "in " + (range_.low_open ? "(" : "[") + text(range_.low) + ", " +
         text(range_.high) + (range_.high_open ? ")" : "]");
}

namespace limits {

constexpr double kNoEnd = std::numeric_limits<double>::infinity();

Limits any() { return {Limits::Kind::kAny, ""}; }
Limits at_least(double low, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, kNoEnd}};
}
Limits above(double low, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, kNoEnd, true}};
}
Limits in(double low, double high, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, high}};
}
Limits in_right_open(double low, double high, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, high, false, true}};
}
Limits in_open(double low, double high, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, high, true, true}};
}
Limits off_or_at_least(double low, std::string note) {
  return {Limits::Kind::kRange, std::move(note), {low, kNoEnd, false, false, true}};
}
Limits one_of(std::vector<double> values, std::string note) {
  return {Limits::Kind::kOneOf, std::move(note), {}, std::move(values)};
}
Limits non_empty(std::string note) { return {Limits::Kind::kNonEmpty, std::move(note)}; }

}  // namespace limits
}  // namespace trainer
