// Grammar text conversions into llguidance's Lark dialect:
//  - llama.cpp's GBNF (what llama-server's `grammar` field takes), and
//  - a list of choices (vLLM's `choice`: the output is exactly one of them).
// Both return an error naming the problem (and its line) for bad input.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace inferd {

// GBNF: `name ::= alternatives` rules (one per line; newlines are allowed
// after `|` and inside parentheses), "literals" and [character classes] with
// llama.cpp's escapes (\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH), `.` for any
// character, ( groups ), rule references, the postfix operators * + ? {m}
// {m,} {m,n} {,n}, and # comments. `root` is the start rule. Token references
// (<...>) are not supported.
//
// Every rule becomes a Lark rule; literals become Lark strings and character
// classes single-character regexes. llguidance lexes terminals greedily (the
// longest match wins), which GBNF, matching character by character, does not:
// a grammar whose meaning depends on a terminal giving up a longer match
// (rare in practice) matches less than llama.cpp would.
Result<std::string> gbnf_to_lark(std::string_view gbnf);

// A Lark grammar matching exactly one of `choices` (non-empty strings).
Result<std::string> choices_to_lark(const std::vector<std::string>& choices);

}  // namespace inferd
