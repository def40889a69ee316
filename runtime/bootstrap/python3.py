# Relay bootstrap for runtime: python3 (DESIGN.md "Handler contract").
# RELAY_HANDLER is "module.function": import module from the app directory
# (the working directory) and call function with the event parsed from stdin.
# An uncaught exception prints a traceback and exits 1.
import importlib
import json
import os
import sys

sys.dont_write_bytecode = True  # /app is read-only
module_name, _, function_name = os.environ["RELAY_HANDLER"].rpartition(".")
sys.path.insert(0, os.getcwd())
event = json.load(sys.stdin)
getattr(importlib.import_module(module_name), function_name)(event)
