# The CUDA sources' compile-time check (scripts/ptxas_report.sh): every .cu built for sm_80 and
# sm_90 with warnings as errors, the ptxas resource report written to build/ptxas-report.md (the
# recorded one is docs/ptxas-report.md), and a failure on any spill to local memory. Wherever nvcc
# is found, GPU or not (label "cuda-build").
if(CTRL_HAVE_CUDA)
  add_test(NAME cuda_ptxas_report
           COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/ptxas_report.sh ${CMAKE_BINARY_DIR}/ptxas-report.md
                   ${CMAKE_CUDA_COMPILER})
  set_tests_properties(cuda_ptxas_report PROPERTIES LABELS cuda-build TIMEOUT 300)
endif()
