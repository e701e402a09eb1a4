# The dataset readers (core/dataset/): tests/dataset/test_*.c are unit tests (label "unit", so the
# sanitizer build runs them too); test_parquet_train.sh trains from parquet and from JSONL.
file(GLOB dataset_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.c)
foreach(src ${dataset_tests})
  ctrl_add_c_test(${src} unit)
endforeach()
if(TARGET ctrl_cli)
  add_test(NAME test_parquet_train COMMAND bash ${CMAKE_SOURCE_DIR}/tests/dataset/test_parquet_train.sh
                                           $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_parquet_train PROPERTIES LABELS e2e TIMEOUT 300)
endif()
