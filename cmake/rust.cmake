# Builds the Rust workspace rust/ with cargo into ONE static library,
# libinferd_rust.a (crate rust/inferd_rust), and links it into the modules that
# call it: inferd_chat (minijinja chat templates, rust/chat_template) and
# inferd_structured (llguidance, grammar-constrained decoding). One archive,
# because two Rust staticlibs in one binary would each bring a copy of std.
#
# cargo runs only when the workspace's sources, Cargo.toml files or Cargo.lock
# change; --locked makes it use exactly the committed rust/Cargo.lock.
# Dependencies come from crates.io (cargo caches them in ~/.cargo). The Rust
# code is always built in release mode: it is not instrumented by
# INFERD_SANITIZE, and ASan builds link and run with it unchanged.
# A cold build takes 1.5 to 2.5 minutes on 2 cores (see docs/design.md, "Structured outputs").

find_program(INFERD_CARGO cargo HINTS $ENV{CARGO_HOME}/bin $ENV{HOME}/.cargo/bin)
if(NOT INFERD_CARGO)
  message(FATAL_ERROR "cargo not found: chat templates (minijinja) and structured outputs "
                      "(llguidance) are Rust crates under rust/. Install Rust (https://rustup.rs) "
                      "or set INFERD_CARGO.")
endif()

# cargo would otherwise start one compiler per core on top of ninja's own jobs.
set(INFERD_CARGO_JOBS "2" CACHE STRING "Parallel jobs for the cargo build of rust/")

set(INFERD_RUST_DIR ${CMAKE_SOURCE_DIR}/rust)
# The Python module's build (build/python) shares the main build's target dir
# (build/rust-target), so that the crates are built once for both: a Rust
# staticlib is position-independent already.
if(INFERD_BUILD_PYTHON)
  set(INFERD_RUST_TARGET_DIR_DEFAULT ${CMAKE_SOURCE_DIR}/build/rust-target)
else()
  set(INFERD_RUST_TARGET_DIR_DEFAULT ${CMAKE_BINARY_DIR}/rust-target)
endif()
set(INFERD_RUST_TARGET_DIR ${INFERD_RUST_TARGET_DIR_DEFAULT} CACHE PATH "cargo's target dir for rust/")
set(INFERD_RUST_LIB ${INFERD_RUST_TARGET_DIR}/release/libinferd_rust.a)
# llguidance's build script copies its C header next to the library.
set(INFERD_LLGUIDANCE_HEADER ${INFERD_RUST_TARGET_DIR}/release/llguidance.h)

file(GLOB_RECURSE INFERD_RUST_SOURCES CONFIGURE_DEPENDS
     ${INFERD_RUST_DIR}/*/src/*.rs ${INFERD_RUST_DIR}/*/Cargo.toml)

add_custom_command(
  OUTPUT ${INFERD_RUST_LIB} ${INFERD_LLGUIDANCE_HEADER}
  COMMAND ${CMAKE_COMMAND} -E env CARGO_TARGET_DIR=${INFERD_RUST_TARGET_DIR}
          ${INFERD_CARGO} build --release --locked --jobs ${INFERD_CARGO_JOBS}
          --manifest-path ${INFERD_RUST_DIR}/Cargo.toml -p inferd_rust
  # cargo leaves the outputs untouched when a change does not affect them (a
  # comment in Cargo.toml); touching keeps ninja from re-running cargo forever.
  COMMAND ${CMAKE_COMMAND} -E touch ${INFERD_RUST_LIB} ${INFERD_LLGUIDANCE_HEADER}
  DEPENDS ${INFERD_RUST_SOURCES} ${INFERD_RUST_DIR}/Cargo.toml ${INFERD_RUST_DIR}/Cargo.lock
  WORKING_DIRECTORY ${INFERD_RUST_DIR}
  COMMENT "cargo build --release rust/ (minijinja, llguidance)"
  VERBATIM)
add_custom_target(inferd_rust_cargo DEPENDS ${INFERD_RUST_LIB} ${INFERD_LLGUIDANCE_HEADER})

add_library(inferd_rust STATIC IMPORTED GLOBAL)
set_target_properties(inferd_rust PROPERTIES IMPORTED_LOCATION ${INFERD_RUST_LIB})
# What Rust's std needs from the system (`cargo rustc -- --print native-static-libs`).
target_link_libraries(inferd_rust INTERFACE Threads::Threads ${CMAKE_DL_LIBS} m rt util gcc_s)
add_dependencies(inferd_rust inferd_rust_cargo)

add_dependencies(inferd_chat inferd_rust_cargo)
target_link_libraries(inferd_chat PUBLIC inferd_rust)
add_dependencies(inferd_structured inferd_rust_cargo)
target_link_libraries(inferd_structured PUBLIC inferd_rust)
target_include_directories(inferd_structured PUBLIC ${INFERD_RUST_TARGET_DIR}/release)
