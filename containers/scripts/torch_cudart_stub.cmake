# Injected with CMAKE_PROJECT_INCLUDE when a CPU build uses PyPI's torch, which is a CUDA build: its CMake
# config links torch::cudart, which a host without the CUDA toolkit cannot provide. The CPU extension
# never calls into CUDA, so an empty imported target satisfies the link interface.
if(NOT TARGET torch::cudart)
  add_library(torch::cudart INTERFACE IMPORTED)
endif()
if(NOT TARGET CUDA::cudart)
  add_library(CUDA::cudart INTERFACE IMPORTED)
endif()
