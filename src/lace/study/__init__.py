"""Studies that run the whole method on real data and write a report: `lace study flickr8k`."""

from lace.study.config import HeadsTraining, StudyConfig
from lace.study.flickr8k import run_flickr8k_study

__all__ = ["HeadsTraining", "StudyConfig", "run_flickr8k_study"]
