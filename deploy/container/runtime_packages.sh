#!/usr/bin/env bash
# Prints the Debian packages holding the shared libraries BINARY links, one per line: the
# container's runtime stage installs these, so its package names follow whichever release built
# the binary (libabsl's version and Debian 13's t64 suffixes differ between releases). A library
# dpkg knows under /lib rather than /usr/lib (Debian 12's merged-/usr layout) is found either way.
# Usage: runtime_packages.sh BINARY
set -euo pipefail
for lib in $(ldd "$1" | awk '/=> \// {print $3}'); do
  real=$(realpath "$lib")
  owner=""
  for path in "$lib" "$real" "${real#/usr}"; do
    owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
    [ -n "$owner" ] && break
  done
  [ -n "$owner" ] || { echo "runtime_packages: no package owns $lib" >&2; exit 1; }
  echo "$owner"
done | sort -u
