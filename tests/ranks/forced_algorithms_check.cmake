# Fails unless every registry entry that `qccl_info -a` lists is forced by name in a real-process run
# (the forced_algorithms list of tests/ranks/CMakeLists.txt, passed as FORCED), the list names no
# entry the registry lacks, and registry_ranks_test has a test case tagged with each forced entry.
# Usage: cmake -DQCCL_INFO=... -DTEST=... -DFORCED=allreduce=ring,... -P forced_algorithms_check.cmake
cmake_minimum_required(VERSION 3.22)

execute_process(COMMAND ${QCCL_INFO} -a OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${QCCL_INFO} -a failed (${status})")
endif()
# Entry lines read "  <Collective> <name> <default size> ...": spelled as QCCL_ALGO takes them.
string(REGEX MATCHALL "\n  [A-Za-z]+ +[a-z0-9_]+ " lines "${listing}")
set(registry)
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^\n  ([A-Za-z]+) +([a-z0-9_]+) $" "\\1=\\2" entry "${line}")
  string(TOLOWER "${entry}" entry)
  list(APPEND registry ${entry})
endforeach()
list(LENGTH registry registry_count)
if(registry_count EQUAL 0)
  message(FATAL_ERROR "no algorithms found in the output of ${QCCL_INFO} -a:\n${listing}")
endif()

string(REPLACE "," ";" forced "${FORCED}")
set(missing ${registry})
list(REMOVE_ITEM missing ${forced})
set(unknown ${forced})
list(REMOVE_ITEM unknown ${registry})

execute_process(COMMAND ${TEST} --list-tags OUTPUT_VARIABLE tags RESULT_VARIABLE status)
set(untagged)
foreach(entry IN LISTS forced)
  string(FIND "${tags}" "[${entry}]" at)
  if(at EQUAL -1)
    list(APPEND untagged ${entry})
  endif()
endforeach()

if(missing OR unknown OR untagged)
  message(FATAL_ERROR "real-process runs must force every registry entry by name:\n"
                      "  in the registry but not in tests/ranks/CMakeLists.txt's forced_algorithms: ${missing}\n"
                      "  in forced_algorithms but not in the registry: ${unknown}\n"
                      "  forced but without a test case so tagged in registry_ranks_test.cc: ${untagged}")
endif()
message(STATUS "all ${registry_count} registry entries are forced by name in registry_ranks_test runs")
