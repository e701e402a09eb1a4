# test_exp_approx runs with UBSan's checks for the undefined behaviour a bit-trick exp can hit
# (a NaN converted to an integer, a negative value shifted), aborting on the first report.
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(test_exp_approx PRIVATE -fsanitize=float-cast-overflow,shift,signed-integer-overflow
                                                 -fno-sanitize-recover=all)
  target_link_options(test_exp_approx PRIVATE -fsanitize=float-cast-overflow,shift,signed-integer-overflow)
endif()
