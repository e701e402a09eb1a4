# Chat templates against transformers (fixtures from tests/reference/make_template_fixtures.py).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/template/test_template.c unit)
# Hostile templates: every limit an error, never a crash or a hang.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/template/test_template_limits.c unit)
