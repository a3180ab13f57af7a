#!/usr/bin/env bash
# Makes `import llama_cpp` (llama-cpp-python) work on top of an existing native llama.cpp build,
# instead of a second 20-30 minute `pip install --no-binary llama-cpp-python` build.
#
# llama-cpp-python is ctypes bindings plus a vendored llama.cpp. This script takes only its Python
# package (llama_cpp/) from the source package on PyPI, installs it into the current Python's
# site-packages, and gives it a lib/ directory of symlinks to the shared libraries of the native
# build that bench/build_llama_cpp.sh makes from the same source package (libllama.so,
# libggml*.so). llama_cpp.py and _ggml.py load their libraries from that lib/ directory (the
# former also honours LLAMA_CPP_LIB_PATH; _ggml.py does not, hence the lib/ directory).
#
# Usage: tools/reference/setup_llama_cpp_python.sh [LIB_DIR]
#   LIB_DIR  directory holding libllama.so and libggml*.so
#            (default ~/.cache/inferd/llama.cpp/build/bin, from bench/build_llama_cpp.sh)
# Environment: LLAMA_CPP_PYTHON_VERSION (default 0.3.36, the version the reference data was made
# with), PYTHON (default python3), SITE (install directory, default the interpreter's purelib).
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
LIB_DIR="$(cd "${1:-${INFERD_CACHE:-$HOME/.cache/inferd}/llama.cpp/build/bin}" && pwd)"
SITE="${SITE:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"

for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
  [[ -e "$LIB_DIR/$lib" ]] || { echo "missing $LIB_DIR/$lib (build it with bench/build_llama_cpp.sh)" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >/dev/null
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name "llama_cpp_python-*")"

# The native build should come from the same vendored llama.cpp; warn if its source is at hand
# and differs (a different llama.cpp computes different logits).
native_src="$(dirname "$(dirname "$LIB_DIR")")/src"
if [[ -d "$native_src/src" ]]; then
  if diff -rq "$src/vendor/llama.cpp/src" "$native_src/src" >/dev/null &&
     diff -rq "$src/vendor/llama.cpp/ggml/src" "$native_src/ggml/src" >/dev/null; then
    echo "native build source matches llama-cpp-python $VERSION's vendored llama.cpp"
  else
    echo "WARNING: $native_src differs from llama-cpp-python $VERSION's vendored llama.cpp" >&2
  fi
fi

rm -rf "$SITE/llama_cpp"
cp -r "$src/llama_cpp" "$SITE/llama_cpp"
mkdir -p "$SITE/llama_cpp/lib"
for f in "$LIB_DIR"/lib*.so*; do ln -sf "$f" "$SITE/llama_cpp/lib/$(basename "$f")"; done
# Make pip aware of it (for `pip show`), without letting pip build anything.
dist="$SITE/llama_cpp_python-$VERSION.dist-info"
rm -rf "$SITE"/llama_cpp_python-*.dist-info
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$VERSION" >"$dist/METADATA"
printf 'setup_llama_cpp_python.sh\n' >"$dist/INSTALLER"
(cd "$SITE" && find llama_cpp "${dist#"$SITE"/}" -type f -o -type l | sed 's/$/,,/') >"$dist/RECORD"

# Its pure-Python dependencies (pyproject.toml of the source package).
"$PY" -m pip install -q "typing-extensions>=4.5.0" "numpy>=1.20.0" "diskcache>=5.6.1" "jinja2>=2.11.3"

"$PY" - <<'EOF'
import llama_cpp
info = llama_cpp.llama_print_system_info().decode()
print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__)
print(info.strip())
flavour = "avx512" if "AVX512 = 1" in info else "avx2"
print("GGML flavour (logits_reference.py's ggml_flavour):", flavour)
EOF
