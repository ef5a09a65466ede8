# The first save of a run killed (SIGKILL) after its step directory was renamed into place and
# before `latest` was written; another run's step directory is then moved into the root. The
# next run, opening the root as every command does (root.h), tells them apart by the root's
# record of its run (`run`): it adopts its own step directory and sets the other aside as
# step_<N>.rejected, removing neither.
# Run as: cmake -DMPIEXEC=scripts/mpiexec.sh -DNP=2 -DHELPER=ckpt_helper -DROOT=dir -P crash_first_save.cmake
cmake_minimum_required(VERSION 3.24)

include(${CMAKE_CURRENT_LIST_DIR}/crash_helper.cmake)

set(mpi ${MPIEXEC} -n ${NP})
set(other ${ROOT}_other)
file(REMOVE_RECURSE ${ROOT} ${other})
helper(crash ${CMAKE_COMMAND} -E env IHA_CKPT_CRASH=renamed:0 ${mpi} ${HELPER} save_run ${ROOT} 1 1 2)
if(EXISTS ${ROOT}/latest OR NOT IS_DIRECTORY ${ROOT}/step_1 OR NOT EXISTS ${ROOT}/run)
  message(FATAL_ERROR "the crash should leave step_1 and the root's record, and no latest")
endif()
# Another run's (complete, verifiable, newer) step directory, moved in.
helper(ok ${mpi} ${HELPER} save_run ${other} 2 1 2)
file(RENAME ${other}/step_2 ${ROOT}/step_2)
helper(ok ${mpi} ${HELPER} check_then_save ${ROOT} 1 3 2 1)
if(NOT helper_out MATCHES "set aside [^\n]*/step_2 as step_2.rejected[^\n]*another run")
  message(FATAL_ERROR "step_2 should be set aside as another run's:\n${helper_out}")
endif()
if(NOT helper_out MATCHES "recovered [^\n]*/step_1")
  message(FATAL_ERROR "step_1 should be recovered:\n${helper_out}")
endif()
file(READ ${ROOT}/latest latest)
string(STRIP "${latest}" latest)
if(NOT latest STREQUAL "step_3" OR NOT IS_DIRECTORY ${ROOT}/step_2.rejected)
  message(FATAL_ERROR "expected latest step_3 and step_2.rejected kept; latest names '${latest}'")
endif()
message(STATUS "first save killed after its rename: own step adopted, another run's set aside")
file(REMOVE_RECURSE ${ROOT} ${other})
