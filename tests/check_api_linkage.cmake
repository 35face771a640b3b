# QLFT_API in include/qlft.h, as the C preprocessor expands it for each kind of compilation
# (on this host, with the Windows branch selected by defining _WIN32 by hand): the library's own
# build exports, a DLL client imports, a static client on Windows adds nothing, and elsewhere the
# symbols keep default visibility. This checks the header's logic, not a Windows link.
# Run: cmake -DCC=<C compiler> -DINCLUDE=<include dir> -P check_api_linkage.cmake
set(decl "uint32_t qlft_version_number(void)")
set(visible "__attribute__((visibility(\"default\")))")
set(cases
    "-D_WIN32 -DQLFT_BUILDING|__declspec(dllexport) ${decl}"
    "-D_WIN32 -UQLFT_BUILDING|__declspec(dllimport) ${decl}"
    "-D_WIN32 -DQLFT_STATIC|${decl}"
    "-DQLFT_BUILDING|${visible} ${decl}"
    "-UQLFT_BUILDING|${visible} ${decl}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/qlft_api_linkage.c "#include <qlft.h>\n")
foreach(c IN LISTS cases)
  string(REPLACE "|" ";" parts "${c}")
  list(GET parts 0 defs)
  list(GET parts 1 want)
  separate_arguments(defs UNIX_COMMAND "${defs}")
  execute_process(COMMAND ${CC} -E -P ${defs} -I${INCLUDE} ${CMAKE_CURRENT_BINARY_DIR}/qlft_api_linkage.c
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "preprocessing qlft.h with '${defs}' failed: ${err}")
  endif()
  string(REGEX MATCH "[^\n]*qlft_version_number\\(void\\)" line "${out}")
  string(STRIP "${line}" line)
  if(NOT line STREQUAL want)
    message(FATAL_ERROR "qlft.h with '${defs}' declares '${line}', expected '${want}'")
  endif()
  message(STATUS "${defs}: ${line}")
endforeach()
