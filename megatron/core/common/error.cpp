// Out-of-line construction of mg::Error so that the throwing path stays off the hot paths.
#include "megatron/core/common/error.h"

#include <cstring>

namespace mg::detail {

void throw_error(const char* file, int line, const char* condition, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  std::ostringstream what;
  what << msg << " [" << base << ":" << line;
  if (condition) what << ", check: " << condition;
  what << "]";
  throw Error(what.str(), msg, file, line);
}

}  // namespace mg::detail
