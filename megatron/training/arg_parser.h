// ArgParser: a small argparse-like flag table with Megatron's conventions, used by arguments.cpp.
//
// Megatron parses with argparse(allow_abbrev=False): `--flag value`, `--flag=value`, switches
// (store_true / store_false), nargs='*' lists, no abbreviations, no positionals. Each flag binds to
// a config field (or a callback) when it is declared, so parsing writes straight into the component
// configs. A YAML file (--yaml-cfg) holds the same flags as keys ("num-layers" or "num_layers")
// with scalar or list values; switches take true/false.
// Errors (mg::Error): an unknown flag names the closest known one by edit distance; a missing or
// malformed value names the flag, the value and what is expected. A flag given twice takes the
// last value, as argparse does; overrides() lists each repetition with both values.
// Not done: argparse's prefix matching (Megatron disables it), positional arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mg::training {

// Levenshtein distance (insert, delete, substitute: cost 1).
std::size_t edit_distance(const std::string& a, const std::string& b);

class ArgParser {
 public:
  using Apply = std::function<void(const std::vector<std::string>& values)>;
  enum class Nargs { zero, one, many };

  // The general form. `name` includes the leading "--".
  void add(const std::string& name, Nargs nargs, Apply apply, const std::string& help,
           const std::string& group = "");

  // Typed bindings (nargs one unless noted).
  void add(const std::string& name, int64_t& field, const std::string& help);
  void add(const std::string& name, int32_t& field, const std::string& help);
  void add(const std::string& name, uint32_t& field, const std::string& help);
  void add(const std::string& name, uint64_t& field, const std::string& help);
  void add(const std::string& name, double& field, const std::string& help);
  void add(const std::string& name, std::string& field, const std::string& help);
  void add(const std::string& name, std::optional<int64_t>& field, const std::string& help);
  void add(const std::string& name, std::optional<double>& field, const std::string& help);
  void add(const std::string& name, std::optional<std::string>& field, const std::string& help);
  void add(const std::string& name, std::vector<std::string>& field, const std::string& help);
  // A switch: sets field = value (store_true: value true; store_false: value false).
  void add_switch(const std::string& name, bool& field, bool value, const std::string& help);
  // One of `choices` (exact spelling), passed to `apply`.
  void add_choice(const std::string& name, const std::vector<std::string>& choices,
                  std::function<void(const std::string&)> apply, const std::string& help);

  // Parses argv-style arguments (without the program name), applying each flag in order.
  void parse(const std::vector<std::string>& args);
  // Applies a YAML file of flags (see the file comment); call before parse(), whose flags then
  // override the file's.
  void parse_yaml_file(const std::string& path);

  bool known(const std::string& name) const { return flags_.count(name) != 0; }
  // Flags given so far (command line or YAML), by name.
  bool given(const std::string& name) const { return given_.count(name) != 0; }
  // The flags given, in order, with their values (switches: empty list): recorded in checkpoints.
  const std::vector<std::pair<std::string, std::vector<std::string>>>& given_values() const {
    return given_order_;
  }
  // A flag given more than once: the earlier and the later value (the later one applies).
  struct Override {
    std::string name;
    std::vector<std::string> before, after;
  };
  const std::vector<Override>& overrides() const { return overrides_; }
  // "--flag-a, --flag-b ..." help text, one flag per line.
  std::string help() const;
  // The known flag closest to `name` by edit distance.
  std::string closest(const std::string& name) const;

 private:
  struct Flag {
    Nargs nargs;
    Apply apply;
    std::string help;
  };
  void apply_flag(const std::string& name, const std::vector<std::string>& values,
                  const std::string& origin);
  std::map<std::string, Flag> flags_;
  std::set<std::string> given_;
  std::set<std::string> from_yaml_;  // given by the YAML file; the command line may override
  std::vector<std::pair<std::string, std::vector<std::string>>> given_order_;
  std::vector<Override> overrides_;
};

// Strict number parsing for flag values: the whole string must be the number.
int64_t parse_int_value(const std::string& flag, const std::string& value);
double parse_double_value(const std::string& flag, const std::string& value);

}  // namespace mg::training
