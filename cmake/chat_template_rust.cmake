# Builds rust/chat_template (minijinja behind a C ABI) with cargo and links the
# resulting static library into inferd_chat.
#
# cargo runs only when the crate's sources, Cargo.toml or Cargo.lock change;
# --locked makes it use exactly the committed Cargo.lock. Dependencies come
# from crates.io (cargo caches them in ~/.cargo). The Rust code is always built
# in release mode: it is not instrumented by INFERD_SANITIZE, and it allocates
# with the C malloc/free, so ASan builds link and run with it unchanged.

find_program(INFERD_CARGO cargo HINTS $ENV{CARGO_HOME}/bin $ENV{HOME}/.cargo/bin)
if(NOT INFERD_CARGO)
  message(FATAL_ERROR "cargo not found: the chat module renders templates with a Rust crate "
                      "(rust/chat_template). Install Rust (https://rustup.rs) or set INFERD_CARGO.")
endif()

# cargo would otherwise start one compiler per core on top of ninja's own jobs.
set(INFERD_CARGO_JOBS "2" CACHE STRING "Parallel jobs for the cargo build of rust/chat_template")

set(INFERD_CHAT_CRATE_DIR ${CMAKE_SOURCE_DIR}/rust/chat_template)
set(INFERD_RUST_TARGET_DIR ${CMAKE_BINARY_DIR}/rust-target)
set(INFERD_CHAT_RUST_LIB ${INFERD_RUST_TARGET_DIR}/release/libinferd_chat_template.a)

file(GLOB_RECURSE INFERD_CHAT_CRATE_SOURCES CONFIGURE_DEPENDS ${INFERD_CHAT_CRATE_DIR}/src/*.rs)

add_custom_command(
  OUTPUT ${INFERD_CHAT_RUST_LIB}
  COMMAND ${CMAKE_COMMAND} -E env CARGO_TARGET_DIR=${INFERD_RUST_TARGET_DIR}
          ${INFERD_CARGO} build --release --locked --jobs ${INFERD_CARGO_JOBS}
          --manifest-path ${INFERD_CHAT_CRATE_DIR}/Cargo.toml
  # cargo leaves the library untouched when a change does not affect it (a
  # comment in Cargo.toml); touching keeps ninja from re-running cargo forever.
  COMMAND ${CMAKE_COMMAND} -E touch ${INFERD_CHAT_RUST_LIB}
  DEPENDS ${INFERD_CHAT_CRATE_SOURCES} ${INFERD_CHAT_CRATE_DIR}/Cargo.toml
          ${INFERD_CHAT_CRATE_DIR}/Cargo.lock
  WORKING_DIRECTORY ${INFERD_CHAT_CRATE_DIR}
  COMMENT "cargo build --release rust/chat_template (minijinja)"
  VERBATIM)
add_custom_target(inferd_chat_template_cargo DEPENDS ${INFERD_CHAT_RUST_LIB})

add_library(inferd_chat_template_rust STATIC IMPORTED GLOBAL)
set_target_properties(inferd_chat_template_rust PROPERTIES IMPORTED_LOCATION ${INFERD_CHAT_RUST_LIB})
# What Rust's std needs from the system (`cargo rustc -- --print native-static-libs`).
target_link_libraries(inferd_chat_template_rust INTERFACE Threads::Threads ${CMAKE_DL_LIBS} m rt util gcc_s)

add_dependencies(inferd_chat inferd_chat_template_cargo)
target_link_libraries(inferd_chat PUBLIC inferd_chat_template_rust)
