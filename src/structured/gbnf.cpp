#include "structured/gbnf.h"

#include <cstdio>
#include <set>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace inferd {

namespace {

// A Lark string literal (JSON string syntax, which llguidance's Lark reads):
// quotes, backslashes and control characters escaped, other UTF-8 as is.
void append_lark_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

void append_regex_codepoint(std::string& out, uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", cp);
  out += buf;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

// GBNF names are case-sensitive and may hold capitals, which Lark reserves for
// terminals: "g_" + the name with each capital X written as "_x" (one-to-one,
// since GBNF names have no '_').
std::string lark_rule_name(std::string_view name) {
  std::string out = "g_";
  for (char c : name) {
    if (c >= 'A' && c <= 'Z') {
      out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view src) : src_(src) {}

  Result<std::string> run() {
    if (!tok::is_valid_utf8(src_)) return make_error("the grammar is not valid UTF-8");
    std::vector<std::pair<std::string, std::string>> rules;  // GBNF name, Lark body
    std::unordered_map<std::string, int> line_of;
    skip_space(true);
    while (pos_ < src_.size()) {
      const int line = line_;
      const std::string name = parse_name();
      if (name.empty()) return fail("expected a rule name");
      skip_space(false);
      if (src_.substr(pos_, 3) != "::=") return fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      skip_space(true);
      std::string body;
      if (!parse_alternates(body, false)) return error();
      if (pos_ < src_.size()) {
        if (src_[pos_] == '\r') ++pos_;
        if (pos_ < src_.size() && src_[pos_] == '\n') {
          ++pos_;
          ++line_;
        } else {
          return fail("expected the end of the line after the rule '" + name + "'");
        }
      }
      if (line_of.count(name))
        return make_error("line " + std::to_string(line) + ": rule '" + name +
                          "' is already defined on line " + std::to_string(line_of[name]));
      line_of[name] = line;
      rules.emplace_back(name, std::move(body));
      skip_space(true);
    }
    if (!line_of.count("root")) return make_error("the grammar has no 'root' rule");
    for (const auto& [name, line] : references_)
      if (!line_of.count(name))
        return make_error("line " + std::to_string(line) + ": rule '" + name + "' is not defined");

    std::string out = "start: " + lark_rule_name("root") + "\n";
    for (const auto& [name, body] : rules) out += lark_rule_name(name) + ": " + body + "\n";
    return out;
  }

 private:
  Result<std::string> fail(const std::string& what) {
    error_ = "line " + std::to_string(line_) + ": " + what;
    return error();
  }
  Error error() const { return make_error(error_); }
  bool set_error(const std::string& what) {
    error_ = "line " + std::to_string(line_) + ": " + what;
    return false;
  }

  // Spaces, tabs and # comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n' && src_[pos_] != '\r') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  // alternates := sequence ('|' sequence)*
  bool parse_alternates(std::string& out, bool nested) {
    if (!parse_sequence(out, nested)) return false;
    while (pos_ < src_.size() && src_[pos_] == '|') {
      ++pos_;
      skip_space(true);
      out += " | ";
      if (!parse_sequence(out, nested)) return false;
    }
    return true;
  }

  // One escaped or plain code point inside a literal or class.
  bool parse_char(uint32_t& cp) {
    if (pos_ >= src_.size()) return set_error("unexpected end of the grammar");
    if (src_[pos_] != '\\') {
      cp = tok::lenient_decode(src_, pos_);
      if (cp == '\n') ++line_;
      return true;
    }
    if (++pos_ >= src_.size()) return set_error("unexpected end of the grammar after '\\'");
    const char e = src_[pos_++];
    int hex_digits = 0;
    switch (e) {
      case 'n': cp = '\n'; return true;
      case 'r': cp = '\r'; return true;
      case 't': cp = '\t'; return true;
      case '\\': case '"': case '[': case ']': cp = static_cast<unsigned char>(e); return true;
      case 'x': hex_digits = 2; break;
      case 'u': hex_digits = 4; break;
      case 'U': hex_digits = 8; break;
      default: return set_error(std::string("unknown escape '\\") + e + "'");
    }
    cp = 0;
    for (int i = 0; i < hex_digits; ++i) {
      if (pos_ >= src_.size()) return set_error("unexpected end of the grammar in a \\x/\\u escape");
      const char h = src_[pos_++];
      int v;
      if (h >= '0' && h <= '9') v = h - '0';
      else if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
      else return set_error(std::string("expected a hex digit in an escape, got '") + h + "'");
      cp = cp * 16 + static_cast<uint32_t>(v);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return set_error("escape names no Unicode character");
    return true;
  }

  bool parse_number(int64_t& n) {
    const size_t start = pos_;
    n = 0;
    while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      n = n * 10 + (src_[pos_++] - '0');
      if (n > 100000) return set_error("repetition count is too large");
    }
    return pos_ > start || set_error("expected a number in a repetition {m,n}");
  }

  // sequence := (item postfix*)*
  bool parse_sequence(std::string& out, bool nested) {
    bool any = false;
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      std::string item;
      if (c == '"') {
        ++pos_;
        std::string text;
        while (pos_ < src_.size() && src_[pos_] != '"') {
          uint32_t cp;
          if (!parse_char(cp)) return false;
          tok::append_utf8(text, cp);
        }
        if (pos_ >= src_.size()) return set_error("unterminated string literal");
        ++pos_;
        append_lark_string(item, text);
      } else if (c == '[') {
        ++pos_;
        item = "/[";
        if (pos_ < src_.size() && src_[pos_] == '^') {
          item += '^';
          ++pos_;
        }
        bool empty = true;
        while (pos_ < src_.size() && src_[pos_] != ']') {
          uint32_t lo;
          if (!parse_char(lo)) return false;
          append_regex_codepoint(item, lo);
          empty = false;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            uint32_t hi;
            if (!parse_char(hi)) return false;
            if (hi < lo) return set_error("character range out of order in [...]");
            item += '-';
            append_regex_codepoint(item, hi);
          }
        }
        if (pos_ >= src_.size()) return set_error("unterminated character class [...]");
        if (empty) return set_error("empty character class []");
        ++pos_;
        item += "]/";
      } else if (c == '.') {
        ++pos_;
        item = "/(?s:.)/";
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        item = "(";
        if (!parse_alternates(item, true)) return false;
        if (pos_ >= src_.size() || src_[pos_] != ')') return set_error("expected ')'");
        ++pos_;
        item += ")";
      } else if (is_name_char(c)) {
        const std::string name = parse_name();
        references_.emplace(name, line_);
        item = lark_rule_name(name);
      } else if (c == '<') {
        return set_error("token references (<...>) are not supported");
      } else {
        break;  // '|', ')', end of line: the caller decides
      }
      skip_space(nested);
      // Postfix operators.
      bool has_postfix = false;
      while (pos_ < src_.size()) {
        const char p = src_[pos_];
        if (p == '*' || p == '+' || p == '?') {
          if (has_postfix) item = "(" + item + ")";  // Lark takes one operator per atom
          item += p;
          has_postfix = true;
          ++pos_;
        } else if (p == '{') {
          ++pos_;
          skip_space(nested);
          int64_t lo = 0, hi = -1;
          bool has_lo = pos_ < src_.size() && src_[pos_] != ',';
          if (has_lo && !parse_number(lo)) return false;
          skip_space(nested);
          bool comma = false;
          if (pos_ < src_.size() && src_[pos_] == ',') {
            comma = true;
            ++pos_;
            skip_space(nested);
            if (pos_ < src_.size() && src_[pos_] != '}') {
              if (!parse_number(hi)) return false;
              skip_space(nested);
            }
          } else {
            hi = lo;
          }
          if (!has_lo && !comma) return set_error("empty repetition {}");
          if (pos_ >= src_.size() || src_[pos_] != '}') return set_error("expected '}' after a repetition");
          ++pos_;
          if (hi >= 0 && hi < lo) return set_error("repetition {m,n} with n < m");
          if (hi == 0)  // Lark has no {0}: zero repetitions match the empty string
            item = "\"\"";
          else
            item = "(" + item + "){" + std::to_string(lo) + "," + (hi >= 0 ? std::to_string(hi) : "") + "}";
          has_postfix = true;
        } else {
          break;
        }
        skip_space(nested);
      }
      if (any) out += ' ';
      out += item;
      any = true;
    }
    if (!any) out += "\"\"";  // an empty alternative matches the empty string
    return true;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::string error_;
  std::set<std::pair<std::string, int>> references_;
};

}  // namespace

Result<std::string> gbnf_to_lark(std::string_view gbnf) { return GbnfParser(gbnf).run(); }

Result<std::string> choices_to_lark(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error("choice must list at least one string");
  std::string out = "start: ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) return make_error("choice " + std::to_string(i) + " is an empty string");
    if (!tok::is_valid_utf8(choices[i]))
      return make_error("choice " + std::to_string(i) + " is not valid UTF-8");
    if (i) out += " | ";
    append_lark_string(out, choices[i]);
  }
  out += "\n";
  return out;
}

}  // namespace inferd
