#!/usr/bin/env bash
# Installs a qccl build into a temporary prefix and uses it as a user would, with nothing from the
# build or source tree on any path:
#   1. cmake --install of the runtime, devel and tools components (and perf when built), as a user;
#   2. the layout: <includedir>/qccl.h (users write #include <qccl.h>), the libqccl.so links, the
#      CMake package, qccl.pc and the tools; the package files name neither tree, and the exported
#      targets name nothing but qccl::qccl (no qccl_core, UCX, Highway or hwloc for consumers);
#   3. examples/quickstart.c built by a CMake project of its own with find_package(qccl) and
#      CMAKE_PREFIX_PATH=<prefix>, linking qccl::qccl alone (a version of another major is refused);
#   4. the same file built with cc $(pkg-config --cflags --libs qccl), PKG_CONFIG_PATH=<libdir>/pkgconfig;
#   5. both programs run with 2 ranks under the installed qcclrun, loading the installed libqccl.so
#      (the first through the RPATH CMake gives it, the second through LD_LIBRARY_PATH), and each rank
#      reports 0 wrong elements; with perf, the installed all_reduce_perf runs from the prefix too
#      (its INSTALL_RPATH finds libqccl.so), and the installed qccl_info runs.
# Registered by tests/install/CMakeLists.txt; QCCL_KEEP_INSTALL_TEST=1 keeps the temporary folder.
set -euo pipefail

usage() {
  echo "usage: $0 --build DIR --source DIR --cmake CMAKE --generator GEN --cc CC --libdir D" \
       "--bindir D --includedir D --version X.Y.Z --perf 0|1" >&2
  exit 2
}
declare -A arg=()
while (($#)); do
  [[ $1 == --* && $# -ge 2 ]] || usage
  arg[${1#--}]=$2
  shift 2
done
for key in build source cmake generator cc libdir bindir includedir version perf; do
  [[ -n ${arg[$key]:-} ]] || usage
done
build=$(cd "${arg[build]}" && pwd) source=$(cd "${arg[source]}" && pwd) cmake=${arg[cmake]} cc=${arg[cc]}

fail() {
  echo "install_test: FAIL: $*" >&2
  exit 1
}
step() { echo "install_test: $*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/qccl-install-test.XXXXXX")
if [[ ${QCCL_KEEP_INSTALL_TEST:-0} == 1 ]]; then
  trap 'echo "install_test: kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
prefix=$work/prefix
libdir=$prefix/${arg[libdir]} bindir=$prefix/${arg[bindir]} includedir=$prefix/${arg[includedir]}
major=${arg[version]%%.*}

# ---- 1. Install ------------------------------------------------------------------------------------
components=(runtime devel tools)
perf_programs=()
if [[ ${arg[perf]} == 1 ]]; then
  components+=(perf)
  perf_programs=(all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf
                 alltoall_perf sendrecv_perf codec_perf)
fi
for component in "${components[@]}"; do
  step "cmake --install $build --prefix $prefix --component $component"
  "$cmake" --install "$build" --prefix "$prefix" --component "$component" >/dev/null
done

# ---- 2. Layout --------------------------------------------------------------------------------------
expect_file() { [[ -f $1 ]] || fail "the install has no $1"; }
expect_file "$includedir/qccl.h"
cmp -s "$includedir/qccl.h" "$source/include/qccl.h" || fail "$includedir/qccl.h differs from include/qccl.h"
[[ -L $libdir/libqccl.so ]] || fail "the install has no link $libdir/libqccl.so (the devel component)"
expect_file "$libdir/libqccl.so"  # the link resolves
[[ -L $libdir/libqccl.so.$major ]] || fail "the install has no SONAME link $libdir/libqccl.so.$major"
expect_file "$libdir/libqccl.so.${arg[version]}"
for f in qcclConfig.cmake qcclConfigVersion.cmake qcclTargets.cmake; do expect_file "$libdir/cmake/qccl/$f"; done
expect_file "$libdir/pkgconfig/qccl.pc"
for program in qcclrun qccl_info qccl_aggregator qccl_sim "${perf_programs[@]}"; do
  [[ -x $bindir/$program ]] || fail "the install has no program $bindir/$program"
done
if hits=$(grep -rlF -e "$build" -e "$source" "$libdir/cmake/qccl" "$libdir/pkgconfig"); then
  fail "installed package files name the build or source tree: $hits"
fi
if hits=$(grep -nE 'qccl_(core|kernels|transports|collectives)|ucx|hwy|hwloc|Threads' \
                "$libdir"/cmake/qccl/qcclTargets*.cmake); then
  fail "the exported targets carry internal or third-party link dependencies:"$'\n'"$hits"
fi
step "layout: header, library links, CMake package, qccl.pc and ${#perf_programs[@]} perf programs + 3 tools"

# A program links libqccl.so alone: the library's own dependencies are the library's business.
expect_links_qccl_only() {
  local needed
  needed=$(readelf -d "$1" | grep NEEDED) || fail "readelf -d $1 failed"
  grep -qF "[libqccl.so.$major]" <<<"$needed" || fail "$1 does not link libqccl.so.$major:"$'\n'"$needed"
  if grep -E 'libucp|libucs|libhwy|libhwloc' <<<"$needed"; then
    fail "$1 links qccl's dependencies itself (they leaked into the consumer's link line)"
  fi
}
# ... and loads the installed one.
expect_loads_installed_qccl() {
  local line loaded
  line=$(ldd "$1" | grep 'libqccl\.so') || fail "ldd $1 finds no libqccl.so"
  loaded=$(sed -E 's/.*=> (.*) \(0x[0-9a-f]+\)$/\1/' <<<"$line")
  [[ -e $loaded && $(realpath "$loaded") == $(realpath "$libdir/libqccl.so.$major") ]] ||
    fail "$1 loads another libqccl.so: $line"
}

# ---- 3. find_package(qccl) -------------------------------------------------------------------------
consumer=$work/cmake-consumer
mkdir -p "$consumer"
cp "$source/examples/quickstart.c" "$consumer/"
cat >"$consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(qccl_install_consumer LANGUAGES C)
# qcclConfigVersion.cmake refuses another major version (SameMajorVersion).
find_package(qccl $((major + 1)).0 CONFIG QUIET)
if(qccl_FOUND)
  message(FATAL_ERROR "find_package(qccl $((major + 1)).0) accepted version \${qccl_VERSION}")
endif()
find_package(qccl ${arg[version]} CONFIG REQUIRED)
if(NOT qccl_VERSION VERSION_EQUAL ${arg[version]})
  message(FATAL_ERROR "found qccl \${qccl_VERSION}, expected ${arg[version]}")
endif()
add_executable(quickstart quickstart.c)
target_link_libraries(quickstart PRIVATE qccl::qccl)
EOF
step "find_package(qccl) with CMAKE_PREFIX_PATH=$prefix"
"$cmake" -S "$consumer" -B "$consumer/build" -G "${arg[generator]}" -DCMAKE_C_COMPILER="$cc" \
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
         >"$work/cmake-consumer.log" 2>&1 || { cat "$work/cmake-consumer.log"; fail "configuring the consumer"; }
grep -qxF "qccl_DIR:PATH=$libdir/cmake/qccl" "$consumer/build/CMakeCache.txt" ||
  fail "find_package(qccl) found another package: $(grep '^qccl_DIR' "$consumer/build/CMakeCache.txt")"
"$cmake" --build "$consumer/build" >>"$work/cmake-consumer.log" 2>&1 ||
  { cat "$work/cmake-consumer.log"; fail "building quickstart.c with qccl::qccl"; }
cmake_quickstart=$consumer/build/quickstart
expect_links_qccl_only "$cmake_quickstart"
expect_loads_installed_qccl "$cmake_quickstart"

# ---- 4. pkg-config ---------------------------------------------------------------------------------
pc=$work/pkg-config-consumer
mkdir -p "$pc"
cp "$source/examples/quickstart.c" "$pc/"
export PKG_CONFIG_PATH=$libdir/pkgconfig
version=$(pkg-config --modversion qccl) || fail "pkg-config finds no qccl in $PKG_CONFIG_PATH"
[[ $version == "${arg[version]}" ]] || fail "pkg-config --modversion qccl says $version, expected ${arg[version]}"
flags=$(pkg-config --cflags --libs qccl)
step "cc quickstart.c $flags"
# shellcheck disable=SC2086  # the flags are words, as in a user's command line
(cd "$pc" && "$cc" quickstart.c $flags -o quickstart) || fail "building quickstart.c with pkg-config's flags"
pc_quickstart=$pc/quickstart
expect_links_qccl_only "$pc_quickstart"
# shellcheck disable=SC2030,SC2031  # LD_LIBRARY_PATH is meant for the pkg-config build's commands only
(export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && expect_loads_installed_qccl "$pc_quickstart")

# ---- 5. Run under the installed qcclrun ------------------------------------------------------------
run_two_ranks() {  # label, program [args]: both ranks exit 0 and print "rank R of 2: 0 wrong elements"
  local label=$1 out
  shift
  step "$label: $bindir/qcclrun -n 2 -- $*"
  local rc=0
  out=$("$bindir/qcclrun" -n 2 --timeout 60 -- "$@" 2>&1) || rc=$?
  ((rc == 0)) || { echo "$out"; fail "$label: qcclrun exited with $rc"; }
  echo "$out"
  [[ $(grep -c "of 2: 0 wrong elements" <<<"$out") == 2 ]] || fail "$label: not every rank reported 0 wrong elements"
}
run_two_ranks "find_package build" "$cmake_quickstart"
# shellcheck disable=SC2030,SC2031
(export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && run_two_ranks "pkg-config build" "$pc_quickstart")

"$bindir/qccl_info" -v >/dev/null || fail "the installed qccl_info -v failed"
"$bindir/qccl_sim" -n 4 -b 1M -z q8 >/dev/null || fail "the installed qccl_sim failed"
if [[ ${arg[perf]} == 1 ]]; then
  expect_loads_installed_qccl "$bindir/all_reduce_perf"
  step "$bindir/qcclrun -n 2 -- $bindir/all_reduce_perf -b 64K -e 64K -n 2 -c 1"
  rc=0
  out=$("$bindir/qcclrun" -n 2 --timeout 60 -- "$bindir/all_reduce_perf" -b 64K -e 64K -n 2 -c 1 2>&1) || rc=$?
  echo "$out"
  ((rc == 0)) || fail "the installed all_reduce_perf: qcclrun exited with $rc"
fi
step "PASS: $prefix builds and runs quickstart.c with find_package(qccl) and with pkg-config"
