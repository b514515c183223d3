"""Version of the Python package; it follows the C library's ANYR_MAJOR.ANYR_MINOR.ANYR_PATCH."""

__version__ = "0.1.0"
