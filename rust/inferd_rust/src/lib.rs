//! The single Rust static library of inferd. It only gathers the C ABIs of
//! the crates it depends on, so that one copy of Rust's std is linked:
//! - `inferd_chat_*` from inferd_chat_template (src/chat/chat_template_ffi.h);
//! - `llg_*` from llguidance (its llguidance.h, used by src/structured/).
//!
//! Re-exporting keeps the `#[no_mangle]` functions of both crates reachable
//! from this crate, so they are in the archive cargo writes.

pub use inferd_chat_template::*;
pub use llguidance::ffi::*;
