"""Print what the script sees of how it was run (as JSON); raise ValueError when argv has 'raise'."""
import json
import sys

level: int = 1  # a module-level annotation: __main__.__annotations__ must hold it as a class

view = {
    "globals": [k for k in globals() if k not in ("json", "sys", "level")],
    "cached": repr(globals().get("__cached__", "<missing>")),
    "annotations": repr(globals().get("__annotations__", "<missing>")),
    "builtins": type(__builtins__).__name__,
    "file": __file__, "name": __name__, "package": __package__, "spec": getattr(__spec__, "name", None),
    "loader": type(__loader__).__name__,
    "argv": sys.argv, "orig_argv": getattr(sys, "orig_argv", None), "path0": sys.path[0],
    "main_is_us": sys.modules["__main__"].__dict__ is globals(),
}
print(json.dumps(view))
if "raise" in sys.argv:
    raise ValueError("raised by the script")
