// The one exception type of xfuser and the macros that throw it.
//
// Every error carries where it was raised (file:line), the rank of the process, the failed check,
// and the operation context stack (XF_CONTEXT scopes), so one log line says what went wrong, where
// and while doing what. `main` catches xfuser::Error, logs it and calls MPI_Abort.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace xfuser {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& check, const std::string& message);

  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }
  // The message as given at the throw site, without location or context.
  const std::string& message() const { return message_; }
  // The XF_CONTEXT scopes active at the throw site, outermost first.
  const std::vector<std::string>& context() const { return context_; }

 private:
  std::string file_;
  int line_;
  int rank_;
  std::string message_;
  std::vector<std::string> context_;
};

// The rank printed in errors and logs (-1 until the parallel layer sets it).
void set_process_rank(int rank);
int process_rank();

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}

// RAII scope that names the operation in progress for errors raised inside it.
class ContextScope {
 public:
  explicit ContextScope(std::string what);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
};

std::vector<std::string> current_context();

}  // namespace detail
}  // namespace xfuser

#define XF_CONCAT_INNER_(a, b) a##b
#define XF_CONCAT_(a, b) XF_CONCAT_INNER_(a, b)

// Throws xfuser::Error when `cond` is false; the remaining arguments are streamed into the message.
#define XF_CHECK(cond, ...)                                                                     \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      throw ::xfuser::Error(__FILE__, __LINE__, #cond, ::xfuser::detail::str_cat(__VA_ARGS__)); \
    }                                                                                           \
  } while (0)

// Throws xfuser::Error unconditionally.
#define XF_THROW(...) \
  throw ::xfuser::Error(__FILE__, __LINE__, "", ::xfuser::detail::str_cat(__VA_ARGS__))

// Names the operation in progress for every error raised in the enclosing scope.
#define XF_CONTEXT(...)                                        \
  ::xfuser::detail::ContextScope XF_CONCAT_(xf_context_scope_, \
                                            __LINE__)(::xfuser::detail::str_cat(__VA_ARGS__))
