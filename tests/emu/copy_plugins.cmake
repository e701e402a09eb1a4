cmake_minimum_required(VERSION 3.16)
# Fills build/plugins-emu with the ordinary build of every plugin that has no emulated build there
# (the emulated ones, named in KEEP, stay). Usage: cmake -DSRC=dir -DDST=dir -DKEEP=a,b -P this.
string(REPLACE "," ";" KEEP "${KEEP}")
file(GLOB plugins "${SRC}/*.so")
foreach(p ${plugins})
  get_filename_component(name ${p} NAME_WE)
  if(NOT name IN_LIST KEEP)
    file(COPY ${p} DESTINATION ${DST})
  endif()
endforeach()
