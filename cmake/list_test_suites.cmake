# Script mode (cmake/TestSuites.cmake): writes CTEST_FILE, an add_test for each suite of
# TEST_EXECUTABLE but the *Gpu ones, named PREFIX.Suite.
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests "--gtest_filter=-*Gpu.*"
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 120)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${status}):\n${errors}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(tests "")
foreach(line IN LISTS lines)
  # A suite's line is its name and a dot, then for typed suites a comment; cases are indented.
  if(line MATCHES "^([^ #]+)\\.( .*)?$")
    set(name "${PREFIX}.${CMAKE_MATCH_1}")
    string(APPEND tests "add_test([==[${name}]==] [==[${TEST_EXECUTABLE}]==] "
                        "[==[--gtest_filter=${CMAKE_MATCH_1}.*:-*Gpu.*]==])\n"
                        "set_tests_properties([==[${name}]==] PROPERTIES TIMEOUT 600)\n")
  endif()
endforeach()
file(WRITE "${CTEST_FILE}" "${tests}")
