// Force-included into mlx-c's C++ sources (Linux build only).
// mlx-c's private/io.h formats error messages with std::format, which libstdc++ only ships from
// GCC 13. Its uses are plain "{}" substitutions, so a tiny stand-in is enough on older compilers.
#pragma once
#ifdef __cplusplus
#include <version>
#ifndef __cpp_lib_format
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace mlx_sys_compat {
inline void format_into(std::ostringstream& os, std::string_view fmt) {
  os << fmt;
}
template <class First, class... Rest>
void format_into(std::ostringstream& os, std::string_view fmt, const First& first,
                 const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    os << fmt;
    return;
  }
  os << fmt.substr(0, at) << first;
  format_into(os, fmt.substr(at + 2), rest...);
}
}  // namespace mlx_sys_compat

template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream os;
  mlx_sys_compat::format_into(os, fmt, args...);
  return os.str();
}
}  // namespace std
#endif
#endif
