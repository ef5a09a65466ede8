# helper(ok|crash COMMAND...): runs a checkpoint helper command; "ok" must exit 0, "crash" must
# not (the crash hook killed it). Sets helper_out (its standard output) in the caller's scope.
# Included by crash_test.cmake and crash_first_save.cmake.
function(helper expect)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect STREQUAL "ok" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "expected success: ${ARGN}\nexit ${rc}\n${out}\n${err}")
  endif()
  if(expect STREQUAL "crash" AND rc EQUAL 0)
    message(FATAL_ERROR "expected the crash hook to kill the run: ${ARGN}\n${out}")
  endif()
  set(helper_out "${out}" PARENT_SCOPE)
endfunction()
