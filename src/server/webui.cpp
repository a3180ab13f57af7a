#include "server/webui.h"

namespace inferd::server {

namespace {

constexpr std::string_view kPrefix = "/webui/";

// Only this server's own scripts and styles (no inline code, so injected
// markup cannot run or restyle the page), fetches to this origin only, images
// only from here or data: URLs (Markdown in an answer cannot make the browser
// fetch another site), no <base>, no form posts elsewhere, no framing.
constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

std::string_view content_type_of(std::string_view name) {
  auto ends_with = [&](std::string_view ext) { return name.ends_with(ext); };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".svg")) return "image/svg+xml";
  return "text/plain; charset=utf-8";
}

const EmbeddedFile* find_file(std::string_view name) {
  for (const EmbeddedFile& f : webui_files())
    if (f.name == name) return &f;
  return nullptr;
}

// If-None-Match is a list of ETags, or "*".
bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  if (if_none_match == "*") return true;
  while (!if_none_match.empty()) {
    const size_t comma = if_none_match.find(',');
    std::string_view tag = if_none_match.substr(0, comma);
    while (!tag.empty() && tag.front() == ' ') tag.remove_prefix(1);
    while (!tag.empty() && tag.back() == ' ') tag.remove_suffix(1);
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    if (tag == etag) return true;
    if (comma == std::string_view::npos) break;
    if_none_match.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

std::string_view webui_content_security_policy() { return kContentSecurityPolicy; }

std::optional<WebResponse> serve_webui(std::string_view path, std::string_view if_none_match) {
  std::string_view name;
  if (path == "/" || path == "/index.html") name = "index.html";
  else if (path.starts_with(kPrefix)) name = path.substr(kPrefix.size());
  else return std::nullopt;
  const EmbeddedFile* file = find_file(name);
  if (!file) return std::nullopt;

  WebResponse res;
  res.content_type = content_type_of(file->name);
  res.headers = {{"Content-Security-Policy", std::string(kContentSecurityPolicy)},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Referrer-Policy", "no-referrer"},
                 // Kept, but checked with the server each time (a cheap 304), so a
                 // new binary's page is seen on the next load.
                 {"Cache-Control", "no-cache"},
                 {"ETag", std::string(file->etag)}};
  if (etag_matches(if_none_match, file->etag)) {
    res.status = http::status::not_modified;
    return res;
  }
  res.body.assign(reinterpret_cast<const char*>(file->bytes.data()), file->bytes.size());
  return res;
}

}  // namespace inferd::server
