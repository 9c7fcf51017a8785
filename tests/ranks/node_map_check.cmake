# Fails unless every rank of a real-process communicator logs the node map EXPECTED (QCCL_DEBUG=INFO
# prints it once per communicator) and the run succeeds. NODE_MAP, when set, is passed as QCCL_NODE_MAP;
# QCCLRUN_ARGS (words separated by spaces) goes to qcclrun before -n; LINKS_R, when set, is a regular expression that
# rank R's "links:" line must match.
# Usage: cmake -DQCCLRUN=... -DTEST=... -DN=4 -DEXPECTED="2 nodes: 0,0,1,1" [-DNODE_MAP=0,0,1,1]
#        [-DQCCLRUN_ARGS=--nodes\;2] [-DLINKS_0=...] -P node_map_check.cmake
cmake_minimum_required(VERSION 3.22)

set(env -x QCCL_DEBUG=INFO -x QCCL_TIMEOUT=60)
set(source "by host")
if(DEFINED NODE_MAP)
  list(APPEND env -x QCCL_NODE_MAP=${NODE_MAP})
  set(source "QCCL_NODE_MAP")
endif()
separate_arguments(qcclrun_args UNIX_COMMAND "${QCCLRUN_ARGS}")
execute_process(COMMAND ${QCCLRUN} ${qcclrun_args} -n ${N} --timeout 120 ${env} -- ${TEST} "zero counts return at once*"
                OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "qcclrun -n ${N} failed (${status}):\n${out}")
endif()
math(EXPR last "${N} - 1")
foreach(rank RANGE ${last})
  string(FIND "${out}" "[${rank}] QCCL INFO node map (${source}): ${EXPECTED}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "rank ${rank} did not log \"node map (${source}): ${EXPECTED}\":\n${out}")
  endif()
  if(DEFINED LINKS_${rank})
    if(NOT out MATCHES "\\[${rank}\\] QCCL INFO links: ${LINKS_${rank}}\n")
      message(FATAL_ERROR "rank ${rank}'s links do not match \"${LINKS_${rank}}\":\n${out}")
    endif()
  endif()
endforeach()
