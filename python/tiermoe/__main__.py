"""python -m tiermoe: which libtiermoe the package loads, and its version."""
from . import __version__, library_path, version

path, origin = library_path()
print(f"tiermoe {__version__} (Python), libtiermoe {version()}: {path} ({origin})")
