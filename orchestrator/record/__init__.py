"""The record layer: what a run writes down (its MLflow run, the timeline of its resizes, its
description, the terminal's progress bar) from the records and events it is given."""
