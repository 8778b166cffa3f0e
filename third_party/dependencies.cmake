# Build glue for dependencies that come from Python packages:
#   nlohmann-json  header-only JSON (config.json, safetensors headers), PyPI `nlohmann-json`
#   nanobind       found by scikit-build-core / `python -m nanobind --cmake_dir`
#   CUTLASS        headers from the `nvidia-cutlass` wheel (CUDA builds only, see cuda/)
find_package(Python 3.10 COMPONENTS Interpreter REQUIRED)

if(NOT SWIFTSPEC_JSON_INCLUDE_DIR)
  execute_process(
    # find_spec locates the package without running its __init__ (which needs importlib_resources)
    COMMAND ${Python_EXECUTABLE} -c "import importlib.util, os; s = importlib.util.find_spec('nlohmann_json'); print(os.path.join(list(s.submodule_search_locations)[0], 'include'))"
    OUTPUT_VARIABLE SWIFTSPEC_JSON_INCLUDE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _json_rc)
  if(NOT _json_rc EQUAL 0 OR NOT EXISTS "${SWIFTSPEC_JSON_INCLUDE_DIR}/nlohmann/json.hpp")
    # `pip install .` gets the package into its own isolated build environment
    # only; a CMake build of your own needs it in the Python CMake finds.
    message(FATAL_ERROR "nlohmann/json.hpp not found: run `${Python_EXECUTABLE} -m pip install "
                        "nlohmann-json==3.12.0`, or set SWIFTSPEC_JSON_INCLUDE_DIR to a folder holding nlohmann/json.hpp")
  endif()
endif()
add_library(swiftspec_json INTERFACE)
target_include_directories(swiftspec_json SYSTEM INTERFACE ${SWIFTSPEC_JSON_INCLUDE_DIR})

if(SKBUILD OR SWIFTSPEC_PYTHON)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
    OUTPUT_VARIABLE _nb_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _nb_rc)
  if(_nb_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH "${_nb_dir}")
  endif()
endif()

# CUTLASS (CUDA builds only): the headers of the nvidia-cutlass wheel, pinned to 4.2.0.0
# (`pip install '.[test]'` installs it; a `SWIFTSPEC_CUDA=ON pip install .` gets it in its build
# environment, pyproject.toml's overrides). The wheel is read, never imported: its Python
# dependencies are not needed for the headers.
if(SWIFTSPEC_CUDA AND NOT SWIFTSPEC_CUTLASS_DIR)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source'))"
    OUTPUT_VARIABLE SWIFTSPEC_CUTLASS_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _cutlass_rc ERROR_QUIET)
endif()
if(SWIFTSPEC_CUDA)
  if(NOT EXISTS "${SWIFTSPEC_CUTLASS_DIR}/include/cutlass/cutlass.h")
    message(FATAL_ERROR "CUTLASS headers not found: run `${Python_EXECUTABLE} -m pip install --no-deps "
                        "nvidia-cutlass==4.2.0.0`, or set SWIFTSPEC_CUTLASS_DIR to a CUTLASS source tree (the folder "
                        "holding include/cutlass and tools/util/include)")
  endif()
  add_library(swiftspec_cutlass INTERFACE)
  # SYSTEM: the library's own warnings stay out of the build log.
  target_include_directories(swiftspec_cutlass SYSTEM INTERFACE "${SWIFTSPEC_CUTLASS_DIR}/include"
                             "${SWIFTSPEC_CUTLASS_DIR}/tools/util/include")
endif()
