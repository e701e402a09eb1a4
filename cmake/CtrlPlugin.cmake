# ctrl_add_plugin(NAME <target> SOURCES <files...> [CUDA_SOURCES <files...>] [LIBS <libs...>])
# Builds one plugin as a MODULE library build/plugins/<target>.so and installs it.
# Plugins include only include/ctrl/ and reach the core through the ctrl_host table.
function(ctrl_add_plugin)
  cmake_parse_arguments(P "" "NAME" "SOURCES;CUDA_SOURCES;LIBS" ${ARGN})
  if(NOT P_NAME)
    message(FATAL_ERROR "ctrl_add_plugin: NAME is required")
  endif()
  set(srcs ${P_SOURCES})
  if(CTRL_HAVE_CUDA AND P_CUDA_SOURCES)
    list(APPEND srcs ${P_CUDA_SOURCES})
  endif()
  add_library(${P_NAME} MODULE ${srcs})
  set_target_properties(${P_NAME} PROPERTIES PREFIX "" LIBRARY_OUTPUT_DIRECTORY ${CTRL_PLUGIN_OUTPUT_DIR}
                                             C_VISIBILITY_PRESET hidden)
  target_include_directories(${P_NAME} PRIVATE ${CMAKE_SOURCE_DIR}/include)
  if(P_LIBS)
    target_link_libraries(${P_NAME} PRIVATE ${P_LIBS})
  endif()
  if(CTRL_HAVE_CUDA AND P_CUDA_SOURCES)
    target_compile_definitions(${P_NAME} PRIVATE CTRL_HAVE_CUDA=1)
    # The CUDA runtime linked statically (nvcc's own default): it maps nothing until the plugin's
    # first CUDA call, so loading the plugin for a CPU run never loads libcudart (test_train.sh
    # checks that no CUDA library is mapped); on a GPU it shares the device's primary context, and
    # so its memory and streams, with libctrl_cuda.
    target_link_libraries(${P_NAME} PRIVATE CUDA::cudart_static)
  endif()
  install(TARGETS ${P_NAME} LIBRARY DESTINATION ${CTRL_PLUGIN_INSTALL_DIR})
endfunction()
