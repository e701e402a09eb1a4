# Sanitizer and fuzzing builds (docs/fuzzing.md). Both need clang and no CUDA:
#   -DCTRL_SANITIZE=ON  every C file, test and plugin built with AddressSanitizer + UBSan; any
#                       undefined behaviour aborts (-fno-sanitize-recover) so a test cannot pass
#                       over it. scripts/test.sh builds this into build-asan/.
#   -DCTRL_FUZZ=ON      additionally instruments the code for libFuzzer's coverage and builds one
#                       fuzz target per parser of untrusted input (tests/fuzz/fuzz_*.c).
option(CTRL_SANITIZE "Build with AddressSanitizer + UndefinedBehaviorSanitizer (clang)" OFF)
option(CTRL_FUZZ "Build the libFuzzer targets in tests/fuzz (clang; implies CTRL_SANITIZE)" OFF)

if(CTRL_FUZZ)
  set(CTRL_SANITIZE ON CACHE BOOL "" FORCE)
endif()

if(CTRL_SANITIZE)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CTRL_SANITIZE/CTRL_FUZZ need clang: configure with -DCMAKE_C_COMPILER=clang")
  endif()
  if(CTRL_HAVE_CUDA)
    message(FATAL_ERROR "CTRL_SANITIZE/CTRL_FUZZ are CPU-only builds: configure with -DCTRL_CUDA=OFF")
  endif()
  set(CTRL_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:${CTRL_SANITIZE_FLAGS}>")
  add_link_options(${CTRL_SANITIZE_FLAGS})
  # The instrumentation keeps clang from vectorising some `omp simd` loops, which it reports as a
  # warning (an error under -Werror); the loops are still correct, only slower.
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-Wno-pass-failed>)
  # clang (unlike GCC) warns about `= {CTRL_OK}`-style partial initialisers, which are idiomatic C
  # (the rest is zeroed); the GCC build's warnings stay the project's bar.
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-Wno-missing-field-initializers>)
  if(CTRL_FUZZ)
    # Coverage feedback for libFuzzer in every library and plugin; only the fuzz targets link
    # libFuzzer's main (-fsanitize=fuzzer, tests/fuzz/CMakeLists.txt).
    add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link>)
    add_link_options(-fsanitize=fuzzer-no-link)
  endif()
  message(STATUS "ctrl: sanitizers ON (ASan+UBSan), fuzz targets ${CTRL_FUZZ}")
endif()
