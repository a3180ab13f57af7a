// The web page's files as the binary carries and serves them (server/webui.h),
// without a server: byte-exact embedding, paths, content types, the security
// headers and revalidation. (The page itself in a browser: tests/e2e/test_webui.py.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "server/webui.h"
#include "test_data.h"

namespace inferd::server {
namespace {

const std::filesystem::path kSourceDir =
    std::filesystem::path(inferd::test::test_data_root()) / ".." / ".." / "src" / "server" / "webui";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string header(const WebResponse& res, std::string_view name) {
  for (const auto& [n, v] : res.headers)
    if (n == name) return v;
  return {};
}

WebResponse get(std::string_view path, std::string_view if_none_match = {}) {
  std::optional<WebResponse> res = serve_webui(path, if_none_match);
  EXPECT_TRUE(res) << path;
  return res ? *res : WebResponse{};
}

TEST(WebUi, CarriesEachFileByteForByte) {
  ASSERT_FALSE(webui_files().empty());
  for (const EmbeddedFile& f : webui_files()) {
    const std::string source = read_file(kSourceDir / f.name);
    ASSERT_FALSE(source.empty()) << f.name;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size()), source) << f.name;
    EXPECT_EQ(f.etag.size(), 34u) << f.name;  // 32 hex digits, quoted
  }
}

TEST(WebUi, ServesThePageAtTheRootAndEveryFileItReferences) {
  const WebResponse page = get("/");
  EXPECT_EQ(page.status, http::status::ok);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.body, read_file(kSourceDir / "index.html"));
  EXPECT_EQ(get("/index.html").body, page.body);

  const std::regex reference(R"re((?:src|href)="/webui/([^"]+)")re");
  int references = 0;
  for (auto it = std::sregex_iterator(page.body.begin(), page.body.end(), reference); it != std::sregex_iterator();
       ++it, ++references) {
    const std::string name = (*it)[1];
    const WebResponse file = get("/webui/" + name);
    EXPECT_EQ(file.status, http::status::ok) << name;
    EXPECT_EQ(file.body, read_file(kSourceDir / name)) << name;
  }
  EXPECT_GE(references, 5);  // the icon, the style sheet, marked, DOMPurify, the page's script
  EXPECT_EQ(get("/webui/app.js").content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(get("/webui/style.css").content_type, "text/css; charset=utf-8");
  EXPECT_EQ(get("/webui/favicon.svg").content_type, "image/svg+xml");
  EXPECT_EQ(get("/webui/vendor/LICENSE-marked.txt").content_type, "text/plain; charset=utf-8");
}

TEST(WebUi, SendsAStrictPolicyWithEveryFile) {
  for (const char* path : {"/", "/webui/app.js", "/webui/vendor/purify.min.js"}) {
    const WebResponse res = get(path);
    const std::string csp = header(res, "Content-Security-Policy");
    EXPECT_EQ(csp, webui_content_security_policy()) << path;
    EXPECT_NE(csp.find("default-src 'none'"), std::string::npos);
    EXPECT_NE(csp.find("script-src 'self'"), std::string::npos);
    EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos);
    EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos);
    EXPECT_EQ(csp.find("unsafe"), std::string::npos);
    EXPECT_EQ(header(res, "X-Content-Type-Options"), "nosniff");
    EXPECT_EQ(header(res, "Cache-Control"), "no-cache");
    EXPECT_FALSE(header(res, "ETag").empty());
  }
}

TEST(WebUi, AnswersAKnownVersionWith304) {
  const std::string etag = header(get("/"), "ETag");
  for (const std::string& given : {etag, "W/" + etag, "\"other\", " + etag, std::string("*")}) {
    const WebResponse res = get("/", given);
    EXPECT_EQ(res.status, http::status::not_modified) << given;
    EXPECT_TRUE(res.body.empty());
    EXPECT_EQ(header(res, "ETag"), etag);
  }
  EXPECT_EQ(get("/", "\"other\"").status, http::status::ok);
  EXPECT_EQ(get("/", header(get("/webui/app.js"), "ETag")).status, http::status::ok);  // another file's tag
}

TEST(WebUi, LeavesOtherPathsToTheApi) {
  for (const char* path : {"/v1/models", "/health", "/webui/", "/webui", "/webui/missing.js", "/webui/index.htmlx",
                           "/webui/../CMakeLists.txt", "/webui//app.js", "/index.htm", "//", "/webui/VERSIONS"})
    EXPECT_FALSE(serve_webui(path, {})) << path;
}

}  // namespace
}  // namespace inferd::server
