# The CUDA sources' compile-time check is the build itself: every .cu built for sm_80 and sm_90 with
# warnings as errors and ptxas -warn-spills (CMakeLists.txt). scripts/ptxas_report.sh writes the
# resource report (docs/ptxas-report.md) by hand; it is no test (it recompiled every source: ~110 s).
