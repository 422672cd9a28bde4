// Errors: every failed check throws mg::Error carrying file, line and a message with the offending
// values. Only tools' main() catch (see format_error_for_user). Never exit() from library code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mg {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string message, const char* file, int line)
      : std::runtime_error(std::move(what)),
        message_(std::move(message)),
        file_(file),
        line_(line) {}
  // The message alone, without location: what a user reads.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* condition,
                              const std::string& msg);
}  // namespace detail

}  // namespace mg

// MG_CHECK(cond, "message " << value): throws mg::Error when cond is false.
#define MG_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      std::ostringstream mg_check_os_;                                          \
      mg_check_os_ << __VA_ARGS__;                                              \
      ::mg::detail::throw_error(__FILE__, __LINE__, #cond, mg_check_os_.str()); \
    }                                                                           \
  } while (0)

// MG_THROW("message " << value): throws unconditionally.
#define MG_THROW(...)                                                           \
  do {                                                                          \
    std::ostringstream mg_check_os_;                                            \
    mg_check_os_ << __VA_ARGS__;                                                \
    ::mg::detail::throw_error(__FILE__, __LINE__, nullptr, mg_check_os_.str()); \
  } while (0)
