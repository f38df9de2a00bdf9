"""Programs the chapters run as they are, so a notebook, its test and a reader run the same code."""
