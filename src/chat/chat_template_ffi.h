/* C ABI of the Rust chat-template renderer (rust/chat_template, minijinja).
 * Keep in sync with rust/chat_template/src/lib.rs.
 *
 * Strings are (pointer, length) byte ranges, so embedded NULs survive. Every
 * buffer handed out by inferd_chat_render is owned by Rust and must be given
 * back with inferd_chat_free(ptr, len). The renderer never unwinds into the
 * caller: a panic comes back as INFERD_CHAT_INTERNAL_ERROR. */
#ifndef INFERD_CHAT_TEMPLATE_FFI_H
#define INFERD_CHAT_TEMPLATE_FFI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum inferd_chat_status {
  INFERD_CHAT_OK = 0,
  INFERD_CHAT_TEMPLATE_ERROR = 1,    /* syntax error, unknown filter, type error, ... */
  INFERD_CHAT_RAISED_EXCEPTION = 2,  /* the template called raise_exception(msg); out = msg */
  INFERD_CHAT_OUT_OF_FUEL = 3,       /* the step limit ran out */
  INFERD_CHAT_OUTPUT_TOO_LARGE = 4,  /* the output passed max_output_bytes */
  INFERD_CHAT_BAD_INPUT = 5,         /* context not a JSON object, template not UTF-8 */
  INFERD_CHAT_INTERNAL_ERROR = 6     /* a panic in the renderer */
};

typedef struct inferd_chat_limits {
  uint64_t fuel;             /* engine instructions one render may execute, */
  uint64_t fuel_per_message; /* plus this many per entry of context.messages */
  uint64_t max_output_bytes; /* largest rendered output */
} inferd_chat_limits;

/* Renders `template_src` (Jinja, UTF-8) with the variables of the JSON object
 * `context_json`, the way Hugging Face transformers does. Returns a status;
 * out / out_len receive the rendered text on INFERD_CHAT_OK and an error
 * message otherwise (release either with inferd_chat_free). */
int32_t inferd_chat_render(const uint8_t* template_src, size_t template_len,
                           const uint8_t* context_json, size_t context_len,
                           const inferd_chat_limits* limits, uint8_t** out, size_t* out_len);

/* Releases a buffer from inferd_chat_render; a null ptr is ignored. */
void inferd_chat_free(uint8_t* ptr, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* INFERD_CHAT_TEMPLATE_FFI_H */
