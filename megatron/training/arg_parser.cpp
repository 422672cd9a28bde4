// ArgParser: Megatron-style flag parsing (argparse with allow_abbrev=False) and YAML flag files.
#include "megatron/training/arg_parser.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::training {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

int64_t parse_int_value(const std::string& flag, const std::string& value) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec == std::errc() && p == end && !value.empty()) return v;
  // Megatron users write 1e6 for counts: accept a float that is an exact integer.
  char* e = nullptr;
  const double d = std::strtod(value.c_str(), &e);
  MG_CHECK(!value.empty() && e == value.c_str() + value.size() && std::isfinite(d) &&
               d == std::floor(d) && std::fabs(d) < 9.0e18,
           flag << " expects an integer, got '" << value << "'");
  return static_cast<int64_t>(d);
}

double parse_double_value(const std::string& flag, const std::string& value) {
  char* e = nullptr;
  const double d = std::strtod(value.c_str(), &e);
  MG_CHECK(!value.empty() && e == value.c_str() + value.size(),
           flag << " expects a number, got '" << value << "'");
  return d;
}

void ArgParser::add(const std::string& name, Nargs nargs, Apply apply, const std::string& help,
                    const std::string&) {
  MG_CHECK(name.rfind("--", 0) == 0, "flag '" << name << "' must start with --");
  MG_CHECK(flags_.count(name) == 0, "flag " << name << " declared twice");
  flags_[name] = Flag{nargs, std::move(apply), help};
}

void ArgParser::add(const std::string& name, int64_t& field, const std::string& help) {
  add(
      name, Nargs::one, [&field, name](const auto& v) { field = parse_int_value(name, v[0]); },
      help);
}
void ArgParser::add(const std::string& name, int32_t& field, const std::string& help) {
  add(
      name, Nargs::one,
      [&field, name](const auto& v) {
        const int64_t x = parse_int_value(name, v[0]);
        MG_CHECK(
            x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(),
            name << " " << x << " is out of range");
        field = static_cast<int32_t>(x);
      },
      help);
}
void ArgParser::add(const std::string& name, uint32_t& field, const std::string& help) {
  add(
      name, Nargs::one,
      [&field, name](const auto& v) {
        const int64_t x = parse_int_value(name, v[0]);
        MG_CHECK(x >= 0 && x <= std::numeric_limits<uint32_t>::max(),
                 name << " " << x << " must be in [0, 2^32)");
        field = static_cast<uint32_t>(x);
      },
      help);
}
void ArgParser::add(const std::string& name, uint64_t& field, const std::string& help) {
  add(
      name, Nargs::one,
      [&field, name](const auto& v) {
        const int64_t x = parse_int_value(name, v[0]);
        MG_CHECK(x >= 0, name << " " << x << " must be >= 0");
        field = static_cast<uint64_t>(x);
      },
      help);
}
void ArgParser::add(const std::string& name, double& field, const std::string& help) {
  add(
      name, Nargs::one, [&field, name](const auto& v) { field = parse_double_value(name, v[0]); },
      help);
}
void ArgParser::add(const std::string& name, std::string& field, const std::string& help) {
  add(
      name, Nargs::one, [&field](const auto& v) { field = v[0]; }, help);
}
void ArgParser::add(const std::string& name, std::optional<int64_t>& field,
                    const std::string& help) {
  add(
      name, Nargs::one, [&field, name](const auto& v) { field = parse_int_value(name, v[0]); },
      help);
}
void ArgParser::add(const std::string& name, std::optional<double>& field,
                    const std::string& help) {
  add(
      name, Nargs::one, [&field, name](const auto& v) { field = parse_double_value(name, v[0]); },
      help);
}
void ArgParser::add(const std::string& name, std::optional<std::string>& field,
                    const std::string& help) {
  add(
      name, Nargs::one, [&field](const auto& v) { field = v[0]; }, help);
}
void ArgParser::add(const std::string& name, std::vector<std::string>& field,
                    const std::string& help) {
  add(
      name, Nargs::many, [&field](const auto& v) { field = v; }, help);
}
void ArgParser::add_switch(const std::string& name, bool& field, bool value,
                           const std::string& help) {
  add(
      name, Nargs::zero, [&field, value](const auto&) { field = value; }, help);
}
void ArgParser::add_choice(const std::string& name, const std::vector<std::string>& choices,
                           std::function<void(const std::string&)> apply, const std::string& help) {
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  add(
      name, Nargs::one,
      [=](const auto& v) {
        MG_CHECK(std::find(choices.begin(), choices.end(), v[0]) != choices.end(),
                 name << " '" << v[0] << "' is not one of: " << list);
        apply(v[0]);
      },
      help + " {" + list + "}");
}

std::string ArgParser::closest(const std::string& name) const {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& [n, f] : flags_) {
    const std::size_t d = edit_distance(name, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

void ArgParser::apply_flag(const std::string& name, const std::vector<std::string>& values,
                           const std::string& origin) {
  auto it = flags_.find(name);
  MG_CHECK(it != flags_.end(),
           "unrecognized argument " << name << origin << "; did you mean " << closest(name) << "?");
  const bool from_yaml = !origin.empty();
  if (!from_yaml && from_yaml_.erase(name)) {
    // The command line overrides the YAML file's value.
    given_.erase(name);
    std::erase_if(given_order_, [&](const auto& g) { return g.first == name; });
  }
  if (!given_.insert(name).second) {
    // argparse: the last value wins (scripts rely on `$COMMON_ARGS --lr 1e-4`). Noted once per
    // repetition with both values.
    auto prev = std::find_if(given_order_.begin(), given_order_.end(),
                             [&](const auto& g) { return g.first == name; });
    MG_CHECK(prev != given_order_.end(), "internal: " << name << " given but not recorded");
    overrides_.push_back({name, prev->second, values});
    given_order_.erase(prev);
  }
  if (from_yaml) from_yaml_.insert(name);
  const Flag& f = it->second;
  if (f.nargs == Nargs::zero)
    MG_CHECK(values.empty(),
             name << " is a switch and takes no value, got '" << values[0] << "'" << origin);
  if (f.nargs == Nargs::one)
    MG_CHECK(values.size() == 1, name << " expects one value, got " << values.size() << origin);
  if (f.nargs == Nargs::many)
    MG_CHECK(!values.empty(), name << " expects at least one value" << origin);
  f.apply(values);
  given_order_.emplace_back(name, values);
}

namespace {
// argparse's rule: "-5" or "-1e-3" is a value (a negative number), "--x" / "-x" a flag.
bool looks_like_flag(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  char* e = nullptr;
  std::strtod(s.c_str(), &e);
  return e != s.c_str() + s.size();
}
}  // namespace

void ArgParser::parse(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size();) {
    const std::string& a = args[i];
    MG_CHECK(looks_like_flag(a) && a.rfind("--", 0) == 0,
             "unexpected argument '" << a << "' (every argument is a --flag)");
    std::string name = a;
    std::vector<std::string> values;
    const auto eq = a.find('=');
    ++i;
    if (eq != std::string::npos) {
      name = a.substr(0, eq);
      values.push_back(a.substr(eq + 1));
    } else {
      auto it = flags_.find(name);
      const Nargs n = it == flags_.end() ? Nargs::zero : it->second.nargs;
      if (n == Nargs::one) {
        MG_CHECK(i < args.size() && !looks_like_flag(args[i]), name << " expects a value");
        values.push_back(args[i++]);
      } else if (n == Nargs::many) {
        while (i < args.size() && !looks_like_flag(args[i])) values.push_back(args[i++]);
      }
    }
    apply_flag(name, values, "");
  }
}

void ArgParser::parse_yaml_file(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    MG_THROW("--yaml-cfg '" << path << "': " << e.what());
  }
  if (root.IsNull()) return;
  MG_CHECK(root.IsMap(), "--yaml-cfg '" << path << "': the top level must be a map of flags");
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    const std::string name = "--" + key;
    const std::string origin = " (in --yaml-cfg '" + path + "')";
    auto it = flags_.find(name);
    MG_CHECK(it != flags_.end(), "unrecognized key '" << kv.first.as<std::string>() << "'" << origin
                                                      << "; did you mean "
                                                      << closest(name).substr(2) << "?");
    const YAML::Node& v = kv.second;
    std::vector<std::string> values;
    if (v.IsSequence()) {
      for (const auto& e : v) values.push_back(e.as<std::string>());
    } else if (v.IsScalar()) {
      values.push_back(v.as<std::string>());
    } else if (!v.IsNull()) {
      MG_THROW("key '" << key << "'" << origin << " must be a scalar or a list");
    }
    if (it->second.nargs == Nargs::zero) {
      MG_CHECK(values.size() == 1 && (values[0] == "true" || values[0] == "false"),
               "key '" << key << "'" << origin << " is a switch: write true or false");
      if (values[0] == "false") continue;  // an unset switch keeps the default
      values.clear();
    }
    if (v.IsNull()) continue;  // `key:` with no value: argparse's None, the default
    apply_flag(name, values, origin);
  }
}

std::string ArgParser::help() const {
  std::ostringstream os;
  for (const auto& [name, f] : flags_) {
    std::string lhs = name + (f.nargs == Nargs::one ? " V" : f.nargs == Nargs::many ? " V..." : "");
    os << "  " << lhs << std::string(lhs.size() < 40 ? 40 - lhs.size() : 1, ' ') << f.help << "\n";
  }
  return os.str();
}

}  // namespace mg::training
