// The web chat page served at / (`inferd serve`; --no-webui turns it off).
// Its files (src/server/webui/) are compiled into the binary, so the page
// needs no files and no network at run time. The page loads without an API
// key, as llama-server's does: it holds nothing secret, and every API call it
// makes sends the key the user gives it.
//
// Every response carries a strict Content-Security-Policy: scripts and styles
// only from this server's own files (none inline), requests only to this
// origin, no frames, no plug-ins. Model output is rendered as Markdown in the
// page, sanitized (DOMPurify), and the policy is the second wall behind that.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <boost/beast/http/status.hpp>

#include "server/http_server.h"

namespace inferd::server {

// A file compiled into the binary (cmake/embed_files.cmake writes the table).
struct EmbeddedFile {
  std::string_view name;  // path relative to src/server/webui, e.g. "vendor/marked.min.js"
  std::span<const unsigned char> bytes;
  std::string_view etag;  // quoted, from the file's SHA-256
};

// The page's files, generated at build time from src/server/webui/.
std::span<const EmbeddedFile> webui_files();

struct WebResponse {
  http::status status = http::status::ok;
  std::string_view content_type;
  std::string body;
  Headers headers;
};

// The answer to `GET path` when the path is one of the page's: "/" and
// "/index.html" are the page, "/webui/NAME" its other files. `if_none_match`
// is the request's If-None-Match header: a file the client already has gets
// 304 and no body. nullopt: not a page path (the API's routing goes on).
std::optional<WebResponse> serve_webui(std::string_view path, std::string_view if_none_match);

// The Content-Security-Policy sent with every file of the page.
std::string_view webui_content_security_policy();

}  // namespace inferd::server
