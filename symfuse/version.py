"""symfuse's version, apart so that the runtime can name it without importing the compiler."""

__version__ = "0.1.0"
