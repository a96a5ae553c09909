"""Studies that run the whole method on real data and write a report: `lace study flickr8k`. Names load on first
use."""

from lace.lazy import lazy_exports

_EXPORTS = {"HeadsTraining": "lace.study.config", "StudyConfig": "lace.study.config",
            "run_flickr8k_study": "lace.study.flickr8k"}
__all__ = ["HeadsTraining", "StudyConfig", "run_flickr8k_study"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
