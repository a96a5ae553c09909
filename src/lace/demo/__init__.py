"""`lace demo`: the whole LACE story on the built-in shapes world, with a report."""

from lace.demo.config import DemoConfig
from lace.demo.pipeline import run_demo

__all__ = ["DemoConfig", "run_demo"]
