#include "structured/json_schema.h"

#include <initializer_list>

namespace inferd {

namespace {

using ordered = nlohmann::ordered_json;

void close_objects(ordered& schema, bool close_here);

// The subschemas of `schema` by keyword: maps of name -> schema, single
// schemas, and arrays of schemas (JSON Schema 2020-12 and draft 4-7 names).
void close_children(ordered& schema) {
  for (const char* key : {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}) {
    auto it = schema.find(key);
    if (it != schema.end() && it->is_object())
      for (auto& [name, sub] : it->items()) close_objects(sub, true);
  }
  for (const char* key : {"additionalProperties", "unevaluatedProperties", "items", "additionalItems",
                          "unevaluatedItems", "contains", "propertyNames", "not", "if", "then", "else"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (it->is_object()) close_objects(*it, true);
    else if (it->is_array() && std::string(key) == "items")  // draft 4's tuple form
      for (ordered& sub : *it) close_objects(sub, true);
  }
  for (const char* key : {"anyOf", "oneOf", "prefixItems"}) {
    auto it = schema.find(key);
    if (it != schema.end() && it->is_array())
      for (ordered& sub : *it) close_objects(sub, true);
  }
  if (auto it = schema.find("allOf"); it != schema.end() && it->is_array())
    for (ordered& sub : *it) close_objects(sub, false);
}

void close_objects(ordered& schema, bool close_here) {
  if (!schema.is_object()) return;  // true / false schemas
  close_children(schema);
  if (close_here && schema.contains("properties") && !schema.contains("additionalProperties") &&
      !schema.contains("patternProperties") && !schema.contains("unevaluatedProperties"))
    schema["additionalProperties"] = false;
}

}  // namespace

void close_json_schema_objects(nlohmann::ordered_json& schema) { close_objects(schema, true); }

}  // namespace inferd
