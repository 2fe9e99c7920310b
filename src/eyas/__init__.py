"""eyas: train EAGLE-3 draft models, and check engine APIs before the expensive step."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("eyas")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
