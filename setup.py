"""`pip install . --no-build-isolation`: the pebble-memplan wheel.

The wheel holds the Python package `pebble` (python/pebble/, with
pebble.torch), its compiled part pebble._core and the C++ command line as
pebble/_bin/pebble, which the `pebble` console command runs
(python/pebble/_cli.py). Both come from the CMake project in this tree,
built from Debian's packages; nothing is downloaded.

Environment:
  PEBBLE_BUILD_DIR   the CMake build directory. One already configured
                     (scripts/build's build/) is built as it is: up to date,
                     nothing is compiled again. Otherwise it is configured
                     first (Release, no tests or benchmarks). Default:
                     build-pip/cmake.
  PEBBLE_CMAKE_ARGS  more arguments for that first configure, e.g.
                     "-DPEBBLE_CUDA=OFF" (shell words).
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (CMake's own variable).
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
# setuptools' own scratch (build/lib..., bdist..., the egg-info), kept out
# of the CMake tree build/ and out of python/.
SCRATCH_DIR = "build-pip"


def fail(message):
    raise SystemExit(f"error: pebble-memplan: {message}")


def project_version():
    """The version of CMakeLists.txt's project(), which `pebble --version` prints."""
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(pebble\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if match is None:
        fail("CMakeLists.txt has no project(pebble VERSION ...)")
    return match.group(1)


def run(command):
    print("pebble-memplan:", shlex.join(command), flush=True)
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError:
        fail(f"'{command[0]}' is not installed (scripts/setup installs what the build needs)")
    except subprocess.CalledProcessError as error:
        fail(f"'{shlex.join(command)}' failed with exit status {error.returncode}")


def cache_entries(build_dir):
    """CMakeCache.txt's NAME:TYPE=VALUE lines as {NAME: VALUE}."""
    entries = {}
    with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            match = re.match(r"([A-Za-z0-9_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if match:
                entries[match.group(1)] = match.group(2)
    return entries


class CMakeBuild(build_ext):
    """Builds pebble._core and the command line with CMake and puts both in
    the wheel: the extension where setuptools expects it, the binary (and
    its CUDA backend, libpebble_cuda.so, where the build has one) in
    pebble/_bin/ beside it."""

    def build_extension(self, ext):
        if self.inplace:
            # It would write _core and the binary into python/pebble/.
            fail("editable installs (pip install -e) are not supported; "
                 "use PYTHONPATH=build/python with a CMake build instead")
        build_dir = os.path.abspath(
            os.environ.get("PEBBLE_BUILD_DIR") or os.path.join(SOURCE_DIR, SCRATCH_DIR, "cmake"))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            self.configure(build_dir)
        cache = cache_entries(build_dir)
        for option in ("PEBBLE_RUNTIME", "PEBBLE_PYTHON"):
            if cache.get(option, "ON").upper() in ("OFF", "0", "FALSE", "NO"):
                fail(f"{build_dir} is configured with {option}=OFF; the wheel needs the Python "
                     "module and the command line: use another PEBBLE_BUILD_DIR")
        run(["cmake", "--build", build_dir, "--target", "pebble_python", "pebble"])

        core = self.get_ext_fullpath(ext.name)
        built_core = os.path.join(build_dir, "python", "pebble",
                                  "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(built_core):
            found = sorted(glob.glob(os.path.join(build_dir, "python", "pebble", "_core*")))
            fail(f"{built_core} was not built"
                 + (f" ({', '.join(found)} is for another Python: "
                    f"configure a new PEBBLE_BUILD_DIR with {sys.executable})" if found else ""))
        os.makedirs(os.path.dirname(core), exist_ok=True)
        shutil.copyfile(built_core, core)

        binary = os.path.join(build_dir, "bin", "pebble")
        if not os.access(binary, os.X_OK):
            fail(f"{binary} was not built")
        bin_dir = os.path.join(os.path.dirname(core), "_bin")
        os.makedirs(bin_dir, exist_ok=True)
        shutil.copy2(binary, os.path.join(bin_dir, "pebble"))  # keeps the exec bit
        # The binary's CUDA backend, where the build has one (CMakeCache.txt
        # then says where, from bin/): the binary looks for it beside itself
        # too (runtime/factory/cuda_plugin.h).
        reldir = cache.get("PEBBLE_CUDA_PLUGIN_RELDIR")
        if reldir:
            plugin = os.path.join(build_dir, "bin", reldir, "libpebble_cuda.so")
            if not os.path.isfile(plugin):
                fail(f"{plugin} was not built (the pebble binary's CUDA backend)")
            shutil.copy2(plugin, os.path.join(bin_dir, "libpebble_cuda.so"))

    def configure(self, build_dir):
        command = ["cmake", "-S", SOURCE_DIR, "-B", build_dir,
                   "-DCMAKE_BUILD_TYPE=Release", "-DPEBBLE_BUILD_TESTS=OFF",
                   "-DPEBBLE_BUILD_BENCH=OFF", f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            command += ["-G", "Ninja"]
        command += shlex.split(os.environ.get("PEBBLE_CMAKE_ARGS", ""))
        run(command)


os.makedirs(SCRATCH_DIR, exist_ok=True)
setup(
    version=project_version(),
    package_dir={"": "python"},
    packages=find_packages("python"),
    # Sources empty: CMakeBuild builds it.
    ext_modules=[Extension("pebble._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={
        "build": {"build_base": os.path.join(SCRATCH_DIR, "wheel")},
        "egg_info": {"egg_base": SCRATCH_DIR},
    },
    zip_safe=False,
)
