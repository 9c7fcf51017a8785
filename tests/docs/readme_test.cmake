# Checks that README.md quotes examples/quickstart.c verbatim: the lines between each pair of
# "/* [readme] */" markers must appear, unchanged, in README.md, less the indentation of the closing
# marker (a region inside a function is shown without the function's indentation).
# Each marker must stand alone on its line, markers come in pairs, and no region may be empty: any
# other layout fails the test rather than skipping a region.
# Usage: cmake -DREADME=... -DEXAMPLE=... -P readme_test.cmake
#
# The example and the README are handled with string(FIND)/string(SUBSTRING) only, never as CMake
# lists or regular-expression patterns, so that C's ';', '[' and ']' need no care.
cmake_minimum_required(VERSION 3.22)
file(READ "${EXAMPLE}" example)
file(READ "${README}" readme)
set(marker "/* [readme] */")
string(LENGTH "${marker}" marker_length)

# Line number (1-based) of offset `at` in the example, for messages.
function(line_of at out)
  string(SUBSTRING "${example}" 0 ${at} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines count)
  math(EXPR line "${count} + 1")
  set(${out} ${line} PARENT_SCOPE)
endfunction()

# Checks that the marker at offset `at` is alone on its line; returns the offset where its line
# starts and the whitespace before the marker (its indentation).
function(check_marker at line_start_out indent_out)
  line_of(${at} line)
  string(SUBSTRING "${example}" 0 ${at} before)
  string(FIND "${before}" "\n" newline REVERSE)
  math(EXPR line_start "${newline} + 1")
  math(EXPR indent_length "${at} - ${line_start}")
  string(SUBSTRING "${example}" ${line_start} ${indent_length} indent)
  if(NOT indent MATCHES "^[ ]*$")
    message(FATAL_ERROR "${EXAMPLE}:${line}: a /* [readme] */ marker must stand alone on its line")
  endif()
  math(EXPR after "${at} + ${marker_length}")
  string(SUBSTRING "${example}" ${after} 1 next)
  if(NOT next STREQUAL "\n")
    message(FATAL_ERROR "${EXAMPLE}:${line}: a /* [readme] */ marker must stand alone on its line")
  endif()
  set(${line_start_out} ${line_start} PARENT_SCOPE)
  set(${indent_out} "${indent}" PARENT_SCOPE)
endfunction()

set(count 0)
set(from 0)
while(TRUE)
  string(SUBSTRING "${example}" ${from} -1 rest)
  string(FIND "${rest}" "${marker}" open)
  if(open EQUAL -1)
    break()
  endif()
  math(EXPR open "${from} + ${open}")
  check_marker(${open} ignored ignored)
  line_of(${open} open_line)
  math(EXPR body_start "${open} + ${marker_length} + 1")  # after the marker's newline
  string(SUBSTRING "${example}" ${body_start} -1 rest)
  string(FIND "${rest}" "${marker}" close)
  if(close EQUAL -1)
    message(FATAL_ERROR "${EXAMPLE}:${open_line}: this /* [readme] */ marker opens a region that no marker closes")
  endif()
  math(EXPR close "${body_start} + ${close}")
  check_marker(${close} close_line_start indent)
  math(EXPR body_length "${close_line_start} - ${body_start}")
  if(body_length LESS_EQUAL 0)
    message(FATAL_ERROR "${EXAMPLE}:${open_line}: empty /* [readme] */ region")
  endif()
  string(SUBSTRING "${example}" ${body_start} ${body_length} body)

  # Remove the closing marker's indentation from every line of the region; a non-blank line without
  # it is a layout error.
  string(LENGTH "${indent}" indent_length)
  set(snippet "")
  set(at 0)
  string(LENGTH "${body}" body_left)
  while(body_left GREATER 0)
    string(SUBSTRING "${body}" ${at} -1 tail)
    string(FIND "${tail}" "\n" newline)
    math(EXPR line_length "${newline} + 1")  # every line of the body ends with a newline
    string(SUBSTRING "${tail}" 0 ${line_length} text)
    string(SUBSTRING "${text}" 0 ${indent_length} prefix)
    if(prefix STREQUAL indent)
      string(SUBSTRING "${text}" ${indent_length} -1 text)
    elseif(NOT text STREQUAL "\n")
      line_of(${body_start} first_line)
      message(FATAL_ERROR "${EXAMPLE}: the region from line ${first_line} has a line indented less than "
                          "its closing marker:\n${text}")
    endif()
    string(APPEND snippet "${text}")
    math(EXPR at "${at} + ${line_length}")
    math(EXPR body_left "${body_left} - ${line_length}")
  endwhile()

  string(FIND "${readme}" "${snippet}" found)
  if(found EQUAL -1)
    message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim (the region from line ${open_line}); "
                        "expected these lines:\n${snippet}")
  endif()
  math(EXPR count "${count} + 1")
  math(EXPR from "${close} + ${marker_length}")
endwhile()
if(count EQUAL 0)
  message(FATAL_ERROR "${EXAMPLE}: no /* [readme] */ markers")
endif()
message(STATUS "README.md quotes the ${count} marked regions of ${EXAMPLE}")
