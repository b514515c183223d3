# docs/reports/*.html are what the doctor's renderer makes of the .json beside them: each is
# rendered again (`anyreduce doctor --report X.json --html ...`) and compared byte for byte, so a
# change to the report reaches the published examples. Run by ctest as
#   cmake -DTOOL=<anyreduce> -DREPORTS=<docs/reports> -DDIR=<scratch dir> -P doctor_reports_current.cmake
file(GLOB measurements "${REPORTS}/*.json")
if(NOT measurements)
  message(FATAL_ERROR "no measurement in ${REPORTS}")
endif()
set(stale "")
foreach(json IN LISTS measurements)
  get_filename_component(name "${json}" NAME_WE)
  set(fresh "${DIR}/${name}.current.html")
  file(REMOVE "${fresh}")
  execute_process(COMMAND "${TOOL}" doctor --report "${json}" --html "${fresh}"
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "anyreduce doctor --report ${json}: exit ${rc}: ${err}")
  endif()
  if(NOT EXISTS "${REPORTS}/${name}.html")
    list(APPEND stale "${name}.html (missing)")
    continue()
  endif()
  file(READ "${fresh}" now)
  file(READ "${REPORTS}/${name}.html" committed)
  if(NOT now STREQUAL committed)
    list(APPEND stale "${name}.html")
  endif()
endforeach()
if(stale)
  message(FATAL_ERROR "docs/reports: not what the renderer makes of the measurement: ${stale}. "
                      "Regenerate each: anyreduce doctor --report docs/reports/NAME.json --html "
                      "docs/reports/NAME.html")
endif()
message("docs/reports: every report is current")
