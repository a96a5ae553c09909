"""`lace demo`: the whole LACE story on the built-in shapes world, with a report. Names load on first use."""

from lace.lazy import lazy_exports

_EXPORTS = {"DemoConfig": "lace.demo.config", "run_demo": "lace.demo.pipeline"}
__all__ = ["DemoConfig", "run_demo"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
