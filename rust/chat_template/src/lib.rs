//! C ABI for rendering chat templates with minijinja; the C declarations live
//! in src/chat/chat_template_ffi.h and must stay in sync with this file.
//!
//! Strings cross the boundary as (pointer, length) byte ranges so embedded NUL
//! characters survive. Every result buffer is allocated here and must be given
//! back with `inferd_chat_free`. Panics never unwind into C++: they are caught
//! and reported as INFERD_CHAT_INTERNAL_ERROR.

mod clock;
mod pyjson;
mod render;

use render::{FailureKind, Limits};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const INFERD_CHAT_OK: i32 = 0;
pub const INFERD_CHAT_TEMPLATE_ERROR: i32 = 1;
pub const INFERD_CHAT_RAISED_EXCEPTION: i32 = 2;
pub const INFERD_CHAT_OUT_OF_FUEL: i32 = 3;
pub const INFERD_CHAT_OUTPUT_TOO_LARGE: i32 = 4;
pub const INFERD_CHAT_BAD_INPUT: i32 = 5;
pub const INFERD_CHAT_INTERNAL_ERROR: i32 = 6;

/// Mirrors `inferd_chat_limits` in chat_template_ffi.h.
#[repr(C)]
pub struct InferdChatLimits {
    pub fuel: u64,
    pub fuel_per_message: u64,
    pub max_output_bytes: u64,
}

/// # Safety
/// `ptr` must be valid for `len` bytes, or `len` must be 0.
unsafe fn byte_slice<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len)
    }
}

/// Hands `bytes` to the caller as a malloc-free heap buffer of exactly `len` bytes.
fn give_to_caller(bytes: Vec<u8>, out: *mut *mut u8, out_len: *mut usize) {
    let boxed = bytes.into_boxed_slice();
    let len = boxed.len();
    let ptr = Box::into_raw(boxed) as *mut u8;
    // SAFETY: the caller passes valid out-pointers (checked non-null by the caller of this fn).
    unsafe {
        *out = ptr;
        *out_len = len;
    }
}

/// Renders `template` (UTF-8 Jinja source) with the variables of the JSON
/// object `context_json`. On INFERD_CHAT_OK `*out` holds the rendered text,
/// otherwise an error message; either way release it with `inferd_chat_free`.
///
/// # Safety
/// The input pointers must be valid for their lengths; `limits`, `out` and
/// `out_len` must be valid pointers.
#[no_mangle]
pub unsafe extern "C" fn inferd_chat_render(
    template: *const u8,
    template_len: usize,
    context_json: *const u8,
    context_len: usize,
    limits: *const InferdChatLimits,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> i32 {
    if out.is_null() || out_len.is_null() {
        return INFERD_CHAT_BAD_INPUT;
    }
    *out = std::ptr::null_mut();
    *out_len = 0;
    if limits.is_null() {
        give_to_caller(b"limits must not be null".to_vec(), out, out_len);
        return INFERD_CHAT_BAD_INPUT;
    }
    let template = byte_slice(template, template_len);
    let context = byte_slice(context_json, context_len);
    let limits = Limits {
        fuel: (*limits).fuel,
        fuel_per_message: (*limits).fuel_per_message,
        max_output_bytes: (*limits).max_output_bytes,
    };

    let outcome = catch_unwind(AssertUnwindSafe(|| render::render(template, context, &limits)));
    let (status, bytes) = match outcome {
        Ok(Ok(text)) => (INFERD_CHAT_OK, text),
        Ok(Err(failure)) => {
            let status = match failure.kind {
                FailureKind::Template => INFERD_CHAT_TEMPLATE_ERROR,
                FailureKind::Raised => INFERD_CHAT_RAISED_EXCEPTION,
                FailureKind::OutOfFuel => INFERD_CHAT_OUT_OF_FUEL,
                FailureKind::OutputTooLarge => INFERD_CHAT_OUTPUT_TOO_LARGE,
                FailureKind::BadInput => INFERD_CHAT_BAD_INPUT,
            };
            (status, failure.message.into_bytes())
        }
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            (INFERD_CHAT_INTERNAL_ERROR, format!("template engine panicked: {detail}").into_bytes())
        }
    };
    give_to_caller(bytes, out, out_len);
    status
}

/// Releases a buffer returned by `inferd_chat_render` (null is ignored).
///
/// # Safety
/// `ptr`/`len` must be exactly what `inferd_chat_render` returned, freed once.
#[no_mangle]
pub unsafe extern "C" fn inferd_chat_free(ptr: *mut u8, len: usize) {
    if !ptr.is_null() {
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)));
    }
}
