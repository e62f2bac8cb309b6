# tests/common/shell_test.sh — sourced first by the shell tests meson runs (tests/meson.build sets their
# environment): strict mode, the built binary (BIN), the source tree (SRC) and a scratch directory (work) that is
# removed however the test ends.
set -euo pipefail
BIN="${OLMOREF_BUILD_ROOT:?}/olmoref"
SRC="${OLMOREF_SOURCE_ROOT:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
