# Checks that README.md quotes examples/quickstart.c verbatim: the lines between the two
# "/* [readme] */" markers must appear, in order and unchanged, in README.md.
# Usage: cmake -DREADME=... -DEXAMPLE=... -P readme_test.cmake
file(READ "${EXAMPLE}" example)
file(READ "${README}" readme)
string(REGEX MATCH "/\\* \\[readme\\] \\*/\n(.*)\n[ ]*/\\* \\[readme\\] \\*/" _ "${example}")
set(snippet "${CMAKE_MATCH_1}")
if(snippet STREQUAL "")
  message(FATAL_ERROR "${EXAMPLE}: no /* [readme] */ markers")
endif()
# The README shows the snippet without the function's indentation.
string(REGEX REPLACE "(^|\n)  " "\\1" snippet "${snippet}")
string(FIND "${readme}" "${snippet}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim; expected these lines:\n${snippet}")
endif()
message(STATUS "README.md quotes ${EXAMPLE}")
