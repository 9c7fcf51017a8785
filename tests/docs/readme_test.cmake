# Checks that README.md quotes examples/quickstart.c verbatim: the lines between each pair of
# "/* [readme] */" markers must appear, unchanged, in README.md.
# Usage: cmake -DREADME=... -DEXAMPLE=... -P readme_test.cmake
file(READ "${EXAMPLE}" example)
file(READ "${README}" readme)
# CMake lists split at ';', which C code is full of: compare with a stand-in for it.
string(REPLACE ";" "<semicolon>" example "${example}")
string(REPLACE ";" "<semicolon>" readme "${readme}")
string(REGEX MATCHALL "/\\* \\[readme\\] \\*/\n[^[]*\n[ ]*/\\* \\[readme\\] \\*/" regions "${example}")
list(LENGTH regions count)
if(count EQUAL 0)
  message(FATAL_ERROR "${EXAMPLE}: no /* [readme] */ markers")
endif()
foreach(region IN LISTS regions)
  string(REGEX REPLACE "^/\\* \\[readme\\] \\*/\n" "" snippet "${region}")
  string(REGEX REPLACE "\n[ ]*/\\* \\[readme\\] \\*/$" "" snippet "${snippet}")
  # The README shows the snippet without the function's indentation.
  string(REGEX REPLACE "(^|\n)  " "\\1" snippet "${snippet}")
  string(FIND "${readme}" "${snippet}" at)
  if(at EQUAL -1)
    string(REPLACE "<semicolon>" ";" snippet "${snippet}")
    message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim; expected these lines:\n${snippet}")
  endif()
endforeach()
message(STATUS "README.md quotes the ${count} marked regions of ${EXAMPLE}")
