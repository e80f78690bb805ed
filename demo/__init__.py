"""The main job: ``make demo``."""
