#include "bench/base_url.h"

#include <algorithm>

namespace inferd::bench {

std::string BaseUrl::target(std::string_view endpoint) const {
  std::string t = prefix;
  if (!endpoint.starts_with('/')) t += '/';
  t += endpoint;
  return t;
}

std::string BaseUrl::host_header() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return port == "80" ? h : h + ":" + port;
}

Result<BaseUrl> parse_base_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) {
    if (url.starts_with("https://")) return make_error("https is not supported; use http://");
    return make_error("base URL must start with http://");
  }
  url.remove_prefix(kScheme.size());
  const size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : url.substr(slash);
  if (authority.find('@') != std::string_view::npos) return make_error("credentials in the URL are not supported");
  BaseUrl out;
  out.port = "80";
  if (authority.starts_with('[')) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return make_error("unclosed '[' in the host");
    out.host = authority.substr(1, close - 1);
    authority.remove_prefix(close + 1);
    if (!authority.empty()) {
      if (!authority.starts_with(':')) return make_error("unexpected text after ']'");
      out.port = authority.substr(1);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    out.host = authority.substr(0, colon);
    out.port = authority.substr(colon + 1);
  } else {
    out.host = authority;
  }
  if (out.host.empty()) return make_error("base URL has no host");
  if (out.port.empty() || out.port.size() > 5 ||
      !std::all_of(out.port.begin(), out.port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(out.port) == 0 || std::stoi(out.port) > 65535)
    return make_error("bad port '" + out.port + "'");
  while (path.ends_with('/')) path.remove_suffix(1);
  if (path.find_first_of("?#") != std::string_view::npos) return make_error("base URL must not have a query");
  out.prefix = path;
  return out;
}

}  // namespace inferd::bench
