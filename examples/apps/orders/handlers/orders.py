"""Handlers of the orders app (see template.yaml).

Each function takes the event, already parsed from JSON. Returning is
success; an exception fails the attempt, and its traceback shows up in the
worker's output. Return values are ignored.
"""
import asyncio
import os


def placed(event):
    order = event["new_image"]
    total = "%.2f %s" % (order["total"], os.environ.get("CURRENCY", ""))
    print("order %s placed: %d items, %s" % (order["id"], order["items"], total.strip()))


async def shipped(event):
    # A coroutine function works too: the bootstrap runs it to completion.
    order = event["new_image"]
    await asyncio.sleep(0.01)  # stands in for a call to a carrier's API
    print("order %s shipped with %s" % (order["id"], order.get("carrier", "an unknown carrier")))
