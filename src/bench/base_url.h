// The server a benchmark talks to, from a URL such as "http://127.0.0.1:8000"
// or "http://host:8080/some/prefix" (plain HTTP only: benchmarks run against
// local servers or through a terminating proxy).
#pragma once
#include <string>
#include <string_view>

#include "core/result.h"

namespace inferd::bench {

struct BaseUrl {
  std::string host;    // name or address; an IPv6 literal without its brackets
  std::string port;    // "80" when the URL names none
  std::string prefix;  // path before the endpoint, without a trailing '/' ("" for none)

  // The request target for an endpoint such as "/v1/completions".
  std::string target(std::string_view endpoint) const;
  // The Host header value.
  std::string host_header() const;
};

Result<BaseUrl> parse_base_url(std::string_view url);

}  // namespace inferd::bench
