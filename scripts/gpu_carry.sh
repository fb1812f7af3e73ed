#!/usr/bin/env bash
# Packs the binaries of a CUDA build into a carry folder for the GPU machine (which has only the
# driver): bin.tar.xz (the stripped binaries: the device tool carries at most 64 MiB), lib/ (the
# shared libraries they load that are not the C/C++ runtime) and optionally shared/. The device-side
# scripts (scripts/gpu_*.sh, scripts/lib/carry.sh) unpack bin.tar.xz on first use.
# Usage: scripts/gpu_carry.sh BUILD_DIR [--out DIR] [--base-bench BIN] [--shared DIR]
#   --out DIR         the carry folder (default .carry; replaced)
#   --base-bench BIN  another build's bench_gpu_decode, carried as bin/base/bench_gpu_decode (for
#                     scripts/gpu_decode.sh --base)
#   --shared DIR      copied as shared/ (fixtures/oracle, fixtures/tokenizer, corpus)
#   -h, --help        this text
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
build="" dest=.carry base="" shared=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --out) dest=$(flag_value "$@") || exit 2; shift ;;
    --base-bench) base=$(flag_value "$@") || exit 2; shift ;;
    --shared) shared=$(flag_value "$@") || exit 2; shift ;;
    -*) echo "error: unknown flag $1 (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$build" ] || { echo "error: one build folder, got '$build' and '$1'" >&2; exit 2; }
       build=$1 ;;
  esac
  shift
done
[ -n "$build" ] && [ -d "$build" ] || { echo "error: build folder '${build}' not found" >&2; exit 2; }
bins=(tandem tandem_backend_tests bench_gpu_decode bench_handoff bench_cpu_decode bench_kernels)
# Where CMake puts each binary: the tool at the top, the tests under tests/, the benchmarks under bench/.
path_of() {
  local d
  for d in "$build" "$build/tests" "$build/bench"; do [ -f "$d/$1" ] && { echo "$d/$1"; return 0; }; done
  return 1
}
for b in "${bins[@]}"; do
  path_of "$b" > /dev/null || { echo "error: $b not built in $build (nor in its tests/ or bench/)" >&2; exit 2; }
done
if [ -e "$dest" ] && [ ! -f "$dest/bin.tar.xz" ]; then
  echo "error: $dest exists and is not a carry folder (no bin.tar.xz): not replacing it" >&2
  exit 2
fi
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for b in "${bins[@]}"; do strip -o "$dest/bin/$b" "$(path_of "$b")"; done
if [ -n "$base" ]; then
  mkdir -p "$dest/bin/base"
  strip -o "$dest/bin/base/bench_gpu_decode" "$base"
fi
# Shared libraries other than the C and C++ runtime, by their soname.
ldd "$(path_of tandem)" "$(path_of tandem_backend_tests)" | awk '/=> \// { print $1, $3 }' | sort -u |
  while read -r name path; do
    case $name in
      libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -L "$path" "$dest/lib/$name" ;;
    esac
  done
[ -z "$shared" ] || cp -r "$shared" "$dest/shared"
tar cJf "$dest/bin.tar.xz" -C "$dest" bin
rm -rf "$dest/bin"
du -sh "$dest" "$dest/bin.tar.xz"
