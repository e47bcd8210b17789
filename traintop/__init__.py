"""traintop: a terminal dashboard for GPU training jobs that explains what it sees."""

__version__ = "0.1.0"
