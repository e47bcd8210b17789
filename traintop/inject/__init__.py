"""Files that `traintop run` copies into a private directory on the job's PYTHONPATH (never imported here)."""
