# Promise 1 and 4: a rank killed (SIGKILL) at any phase of a save leaves the previous
# checkpoint loadable and `latest` naming a complete one; the next run, opening the root as
# every command does (root.h), recovers: a complete step left unnamed by `latest` (crash after
# its rename) is verified and adopted; its save succeeds despite the leftovers and removes them.
# Run as: cmake -DMPIEXEC=scripts/mpiexec.sh -DNP=2 -DHELPER=ckpt_helper -DROOT=dir -P crash_test.cmake
cmake_minimum_required(VERSION 3.24)

include(${CMAKE_CURRENT_LIST_DIR}/crash_helper.cmake)

set(mpi ${MPIEXEC} -n ${NP})
file(REMOVE_RECURSE ${ROOT})
helper(ok ${mpi} ${HELPER} save ${ROOT} 1 1 2)
helper(ok ${mpi} ${HELPER} save ${ROOT} 2 1 2)
set(committed 2)
set(next 3)
# <phase>:<rank>: every phase on every rank that reaches it (the commit phases run on rank 0
# only: rank 0 alone writes the manifest, renames and replaces `latest`).
foreach(case begin:0 begin:1 created:0 created:1 data_half:0 data_half:1 data_done:0 data_done:1
             manifest:0 renamed:0 latest_renamed:0 latest:0)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 phase)
  helper(crash ${CMAKE_COMMAND} -E env IHA_CKPT_CRASH=${case} ${mpi} ${HELPER} save ${ROOT} ${next} 1 2)
  file(READ ${ROOT}/latest latest)
  string(STRIP "${latest}" latest)
  if(phase MATCHES "^latest")
    set(committed ${next})  # the crash came after the commit
  endif()
  if(NOT latest STREQUAL "step_${committed}")
    message(FATAL_ERROR "crash at ${case}: latest names '${latest}', expected step_${committed}")
  endif()
  file(GLOB leftovers ${ROOT}/*.tmp-*)
  if(phase MATCHES "^(created|data_half|data_done|manifest)$" AND NOT leftovers)
    message(FATAL_ERROR "crash at ${case} left no temporary directory: the test proves nothing")
  endif()
  if(phase STREQUAL "renamed")
    if(NOT IS_DIRECTORY ${ROOT}/step_${next})
      message(FATAL_ERROR "crash at ${case}: step_${next} should be complete but unnamed by latest")
    endif()
    set(committed ${next})  # recovery adopts it
  endif()
  # A new run on another mesh: latest loads bit-exactly, the next save works and cleans up.
  math(EXPR after "${next} + 1")
  helper(ok ${mpi} ${HELPER} check_then_save ${ROOT} ${committed} ${after} 2 1)
  set(committed ${after})
  math(EXPR next "${after} + 1")
  message(STATUS "crash at ${case}: previous checkpoint intact, next save ok")
endforeach()
file(REMOVE_RECURSE ${ROOT})
