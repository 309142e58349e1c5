# add_test_suites(TARGET): one ctest entry per GoogleTest suite of TARGET (`TARGET.Suite`, run as
# --gtest_filter=Suite.*), found after each build by listing the binary's tests, as
# gtest_discover_tests finds cases. Each entry is a process, and each process spends about a second
# of CPU loading LibTorch before its first test: one per case (about 280) was half of ctest's time
# on 2 cores. The suites named *Gpu stay one entry per case (gtest_discover_tests), so that each
# case skipped without a GPU shows as skipped, with its reason, and no skip hides a failure.
function(add_test_suites target)
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>"
            -D "CTEST_FILE=${ctest_file}" -D "PREFIX=${target}"
            -P "${PROJECT_SOURCE_DIR}/cmake/list_test_suites.cmake"
    BYPRODUCTS "${ctest_file}" VERBATIM)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${ctest_file}")
  gtest_discover_tests(${target} TEST_FILTER "*Gpu.*" DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 600)
endfunction()
