# `anyreduce doctor` end to end with the tiny preset, then the measurement it wrote loaded back
# into the verdict and report (every field present). Run by ctest as
#   cmake -DTOOL=<anyreduce> -DDIR=<dir> -P doctor_tiny.cmake
# The doctor needs two GPUs; with fewer it says so, and this test then prints "SKIPPED:" (which
# the test's SKIP_REGULAR_EXPRESSION reports as skipped, not passed). Files of an earlier run are
# removed first, so the second step never reads a stale measurement.
set(json "${DIR}/doctor_tiny.json")
set(html "${DIR}/doctor_tiny.html")
set(again "${DIR}/doctor_tiny_again.html")
file(REMOVE "${json}" "${html}" "${again}")

execute_process(
  COMMAND "${TOOL}" doctor --preset tiny --batch 1,8 --sweep 1,8,64 --samples 5 --sustain 300ms
          --timeout-ms 20000 --json "${json}" --html "${html}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(err MATCHES "needs at least 2 ranks")
  message("SKIPPED: the doctor needs two GPUs")
  return()
endif()
if(NOT rc EQUAL 0 OR NOT out MATCHES "report: [^ ]*doctor_tiny[.]html" OR NOT EXISTS "${json}")
  message(FATAL_ERROR "doctor run: exit ${rc}, or no report line, or no ${json}")
endif()

execute_process(COMMAND "${TOOL}" doctor --report "${json}" --html "${again}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "^Communication is [0-9.]+% of a decode step at batch"
   OR NOT out MATCHES "What to do:" OR NOT out MATCHES "Target: a decode step")
  message(FATAL_ERROR "doctor --report: exit ${rc}, or no headline, what to do or target")
endif()
if("${out}${err}" MATCHES "measurement: '|json[.]exception|cannot read|is not JSON")
  message(FATAL_ERROR "doctor --report did not load every field of the measurement")
endif()
