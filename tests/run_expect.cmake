# Runs one command and checks its exit status and its output together (ctest's
# PASS_REGULAR_EXPRESSION alone ignores the exit status). Run by ctest as
#   cmake "-DCMD=<program>;<arg>;..." -DPASS=<regex> [-DFAIL=<regex>] -P run_expect.cmake
# Passes when the command exits 0, its output (stdout and stderr) matches PASS, and, where FAIL
# is given, does not match FAIL.
if(NOT DEFINED CMD OR NOT DEFINED PASS)
  message(FATAL_ERROR "run_expect.cmake needs -DCMD and -DPASS")
endif()
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit status ${rc} (expected 0)")
endif()
if(NOT "${out}${err}" MATCHES "${PASS}")
  message(FATAL_ERROR "output does not match: ${PASS}")
endif()
if(DEFINED FAIL AND "${out}${err}" MATCHES "${FAIL}")
  message(FATAL_ERROR "output matches what it must not: ${FAIL}")
endif()
