"""Report how this script was run: argv, __file__, __name__, sys.path[0], as JSON on stdout."""
import json
import sys

print(json.dumps({"argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0]}))
