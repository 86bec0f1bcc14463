"""Worker: writes its argv and $TRICKY as JSON to $OUT_DIR (or .)/rank<R>.json (injection test)."""

import json
import os
import sys

path = os.path.join(os.environ.get("OUT_DIR", os.getcwd()), f"rank{os.environ['RANK']}.json")
with open(path, "w", encoding="utf-8") as f:
    json.dump({"argv": sys.argv[1:], "tricky": os.environ.get("TRICKY")}, f)
