"""``import swiftspec_core``: the compiled runtime of swiftspec (see its ``__doc__``).

The extension module is built inside the package, as ``swiftspec.swiftspec_core``; this top-level
module replaces itself in ``sys.modules`` by it, so ``import swiftspec_core`` gives that very module
object (one module: its classes, its state and its docs are the extension's own, never a copy).

Raises:
    ImportError: swiftspec was installed without its compiled extension.
"""

import sys

from swiftspec import swiftspec_core as _core

# The import system returns what sys.modules holds under the name once this file has run.
sys.modules[__name__] = _core
