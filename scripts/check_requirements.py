"""Exit 0 when every `name==version` line of a requirements file is installed."""
import sys
from importlib import metadata

ok = True
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        ok = False
        continue
    if version and have != version:
        ok = False
sys.exit(0 if ok else 1)
