"""The `pebble` command of a pip-installed pebble (the `pebble-memplan` wheel).

setup.py bundles the C++ command line as pebble/_bin/pebble; this entry
point replaces the Python process with it, so arguments, exit status,
stdin/stdout and signals are the binary's own. A pebble imported from a
build tree or a `cmake --install` prefix has no bundled binary: there the
command is the prefix's bin/pebble.
"""

import os
import sys


def binary_path():
    """Where the wheel puts the command-line binary."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "pebble")


def main():
    path = binary_path()
    if not os.access(path, os.X_OK):
        sys.stderr.write(
            f"pebble: the command-line binary is missing at {path}; "
            "reinstall with `pip install . --no-build-isolation` from pebble's source tree\n")
        return 127
    try:
        os.execv(path, ["pebble"] + sys.argv[1:])
    except OSError as error:
        sys.stderr.write(f"pebble: cannot run {path}: {error.strerror}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main())
