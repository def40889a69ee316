"""The orders app's handlers (template.yaml names them handlers.orders.<function>)."""
