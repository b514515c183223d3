# The installed CMake package's version policy, which follows the soname
# (libanyreduce.so.<major>): a request for the installed major version and the same or an older
# minor is accepted; a newer minor or another major version is refused. Run as
#   cmake -DDIR=<prefix>/<libdir>/cmake/anyreduce -P version_policy.cmake
set(PACKAGE_FIND_NAME anyreduce)

# ask(VERSION WANT): the version file's verdict on find_package(anyreduce VERSION) must be WANT.
function(ask version want)
  set(PACKAGE_FIND_VERSION ${version})
  string(REPLACE "." ";" parts "${version}")
  list(LENGTH parts PACKAGE_FIND_VERSION_COUNT)
  list(APPEND parts 0 0 0)
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  set(CMAKE_SIZEOF_VOID_P 8)
  include("${DIR}/anyreduceConfigVersion.cmake")
  if(PACKAGE_VERSION_COMPATIBLE)
    set(got TRUE)
  else()
    set(got FALSE)
  endif()
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "find_package(anyreduce ${version}) against ${PACKAGE_VERSION}: "
                        "compatible=${got}, the soname's policy says ${want}")
  endif()
endfunction()

include("${DIR}/anyreduceConfigVersion.cmake")  # PACKAGE_VERSION: the installed version
string(REPLACE "." ";" installed "${PACKAGE_VERSION}")
list(GET installed 0 major)
list(GET installed 1 minor)
math(EXPR next_minor "${minor} + 1")
math(EXPR next_major "${major} + 1")
ask("${major}.${minor}" TRUE)
ask("${major}.0" TRUE)
ask("${major}" TRUE)
ask("${major}.${next_minor}" FALSE)
ask("${next_major}.0" FALSE)
if(major GREATER 0)
  math(EXPR prev_major "${major} - 1")
  ask("${prev_major}.${minor}" FALSE)
endif()
message("version policy: ${PACKAGE_VERSION} accepts ${major}.0..${major}.${minor}, refuses "
        "${major}.${next_minor} and ${next_major}.0 (SameMajorVersion, as libanyreduce.so.${major})")
