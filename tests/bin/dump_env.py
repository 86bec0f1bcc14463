"""Write this worker's environment as JSON to argv[1]/rank<RANK>.json (argv too)."""
import json
import os
import sys

with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv}, f)
