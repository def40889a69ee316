# Relay bootstrap for `runtime: python3` (docs/runtimes.md; docs/apps.md
# "The handler contract"). The containerd runner mounts this file read-only at
# /relay/bootstrap.py and runs `python3 -u -B /relay/bootstrap.py` with the
# app directory (/app) as working directory.
#
# RELAY_HANDLER is "module.function", split at the last dot. The module is
# imported by its dotted path (a package path such as events.created works)
# with the app directory first on sys.path. The function is called with the
# event parsed from stdin (JSON); a coroutine it returns runs to completion
# under asyncio.run. Its return value is ignored.
#
# Exit codes:
#   0    the function returned
#   1    the function raised, or the module raised while being imported:
#        the traceback is on stderr, its last line names the exception
#   2    RELAY_HANDLER is missing or malformed, or stdin is not JSON
#   65   the function raised an exception whose relay_permanent attribute
#        is True (set it on the class): a permanent failure, not retried
#        (docs/delivery.md#permanent-failures)
#   127  the module or the function does not exist (message on stderr)
#
# Warm mode (`warm: true`; argv "--warm"): the process serves invocations
# one at a time until stdin ends. Each request is one line of JSON on stdin,
#   {"token": T, "handler": "module.function", "env": {...}, "event": "<JSON text>"}
# and each outcome is the line `T {"code": N, "clean": B}` on stdout, N being
# the exit code a one-shot run would have had, after the line `T` on stderr.
# T is a random token the runner makes for each request: the runner finds
# the frames by it, anywhere in the byte streams, so handler output (which
# goes to stdout and stderr as usual, before the frames) can never be taken
# for one. The environment is reset to the process's initial one plus "env"
# before each call; imported modules stay loaded (that is the point).
# Processes do not carry over: after each call the bootstrap, which is the
# container's init (PID 1), kills every other process of the container and
# reaps them; B is true when it saw none left, and false tells the runner to
# replace the container (docs/runtimes.md "Warm containers").
#
# Start-up time counts for every one-shot attempt (docs/runtimes.md "Python
# (`runtime: python3`)"): only what every run needs is imported here, and
# what failures (traceback) or warm mode (signal, time) need is imported
# where it is used; inspect, which alone takes longer than the interpreter's
# start, is not imported at all. Neither is json, which imports re (and with
# it enum, functools and collections) for one-shot runs: the event is parsed
# by the json module's own C scanner (parse_event).
import importlib
import os
import sys

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PERMANENT = 65
EXIT_NOT_FOUND = 127

# The bootstrap's own directory (empty when run with -c) must not shadow the
# app's modules; the app directory takes its place at the head of sys.path.
_here = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else ""


def fail(code, message):
    sys.stderr.write("relay: " + message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def internal(filename):
    """Whether a traceback frame belongs to this bootstrap or to the machinery
    it calls the handler through (importlib, asyncio)."""
    if filename == "<string>" or filename.startswith("<frozen importlib"):
        return True
    if _here and os.path.dirname(filename) == _here:
        return True
    for name in ("importlib", "asyncio"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            if filename.startswith(os.path.dirname(module.__file__) + os.sep):
                return True
    return False


def report(exc):
    """Print exc's traceback from the first frame of the app's code on."""
    tb = exc.__traceback__
    while tb is not None and internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    import traceback

    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
    sys.stderr.flush()


def failure_code(exc):
    """The exit code of a handler that raised exc."""
    return EXIT_PERMANENT if getattr(exc, "relay_permanent", False) is True else EXIT_FAILED


def load(handler, app_dir):
    module_name, _, function_name = handler.rpartition(".")
    if not module_name or not function_name or module_name.startswith("."):
        fail(EXIT_USAGE, "RELAY_HANDLER=%r is not module.function" % handler)
    try:
        __import__(module_name)
        # The module itself, not its top-level package, and whatever the
        # module put in its own place in sys.modules, as import_module
        # returns.
        module = sys.modules[module_name]
    except ModuleNotFoundError as e:
        # Only the handler's own module (or a package on its path) missing
        # means "not found"; a missing import inside the app's code is the
        # app's error and gets its traceback.
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            fail(EXIT_NOT_FOUND, "handler %s: module %r not found in %s" % (handler, module_name, app_dir))
        raise
    function = getattr(module, function_name, None)
    if function is None:
        fail(EXIT_NOT_FOUND, "handler %s: module %r has no function %r" % (handler, module_name, function_name))
    if not callable(function):
        fail(EXIT_NOT_FOUND, "handler %s: %s.%s is not a function (it is %s)"
             % (handler, module_name, function_name, type(function).__name__))
    return function


class _ScanContext:
    """The settings json.loads passes its C scanner by default."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_JSON_SPACE = " \t\n\r"


def parse_event(raw):
    """json.loads(raw), through the scanner json.loads itself uses (the
    _json C module) without importing json. Anything it does not take at
    once (another encoding, a BOM, an error, no C scanner) goes to
    json.loads, so results and error messages are json.loads's own."""
    try:
        from _json import make_scanner

        text = raw.decode("utf-8")
        start = len(text) - len(text.lstrip(_JSON_SPACE))
        value, end = make_scanner(_ScanContext())(text, start)
        if not text[end:].strip(_JSON_SPACE):
            return value
    except Exception:
        pass
    import json

    return json.loads(raw)


def read_event():
    raw = sys.stdin.buffer.read()
    try:
        return parse_event(raw)
    except ValueError as e:
        fail(EXIT_USAGE, "stdin is not a JSON event: %s" % e)


# CO_ITERABLE_COROUTINE: a generator made awaitable by types.coroutine.
_CO_ITERABLE_COROUTINE = 0x100


def awaitable(obj):
    """inspect.isawaitable without importing inspect: a coroutine, a
    generator-based coroutine, or an object whose type defines __await__."""
    code = getattr(obj, "gi_code", None)
    if code is not None and code.co_flags & _CO_ITERABLE_COROUTINE:
        return True
    return hasattr(type(obj), "__await__")


def call(function, event):
    result = function(event)
    if awaitable(result):
        import asyncio

        async def wait():
            return await result

        asyncio.run(wait())


def setup_path():
    app_dir = os.getcwd()
    if sys.path and sys.path[0] in ("", _here):
        sys.path[0] = app_dir
    else:
        sys.path.insert(0, app_dir)
    return app_dir


def main():
    handler = os.environ.get("RELAY_HANDLER", "")
    app_dir = setup_path()
    try:
        function = load(handler, app_dir)
        event = read_event()
        call(function, event)
    except SystemExit:
        raise
    except BaseException as e:  # KeyboardInterrupt included: the handler failed
        report(e)
        sys.exit(failure_code(e))


def exit_code(e):
    """The process exit code SystemExit e would give, printing a message
    argument as the interpreter does."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    sys.stderr.write(str(e.code) + "\n")
    return EXIT_FAILED


def invoke(handler, app_dir, raw_event):
    """One warm invocation: the exit code a one-shot run would end with."""
    import json

    try:
        function = load(handler, app_dir)
        try:
            event = json.loads(raw_event)
        except ValueError as e:
            fail(EXIT_USAGE, "the event is not JSON: %s" % e)
        call(function, event)
        return 0
    except SystemExit as e:  # fail(), or the handler's own sys.exit(n)
        return exit_code(e)
    except BaseException as e:
        report(e)
        return failure_code(e)


def flush_output():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a handler may have replaced or closed them
            pass


# How long a warm invocation's leftover processes may take to die and be
# reaped before the bootstrap gives up and has the container replaced.
CLEAN_UP_SECONDS = 2.0


def other_processes():
    """The PIDs of the container's processes other than this one, zombies
    included (the container has a PID namespace and a /proc of its own)."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]


def reap():
    """Collect every child that has ended; orphans are the init's children."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def clean_up():
    """Kill every process of the container but this one and reap them all,
    so that the next invocation starts with the process table of the first.
    Returns True when no other process is left. Only as the container's init:
    anywhere else kill(-1) would reach every process of the user."""
    if os.getpid() != 1:
        return False
    import signal
    import time

    deadline = time.monotonic() + CLEAN_UP_SECONDS
    pause = 0.0005
    try:
        while True:
            try:
                os.kill(-1, signal.SIGKILL)  # everything in the PID namespace but us
            except ProcessLookupError:
                pass  # nothing left to signal
            reap()
            if not other_processes():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)  # SIGKILLed processes take a moment to exit
            pause = min(pause * 2, 0.05)
    except OSError:
        return False


def serve():
    import json

    app_dir = setup_path()
    me = os.getpid()
    del sys.argv[1:]
    # Requests come on a private copy of stdin; the handler's stdin is
    # /dev/null, so that a handler reading it cannot swallow the next request.
    requests = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    baseline = dict(os.environ)
    while True:
        line = requests.readline()
        if not line:
            return  # stdin closed: the runner is done with this container
        req = json.loads(line)
        os.environ.clear()
        os.environ.update(baseline)
        os.environ.update(req["env"])
        code = invoke(req["handler"], app_dir, req["event"])
        flush_output()
        if os.getpid() != me:
            # A child the handler forked returned into the bootstrap: it
            # must not answer requests. The init kills it anyway.
            os._exit(code)
        clean = clean_up()
        token = req["token"].encode()
        # stderr first: the runner waits for both markers, and the stdout
        # frame is the one it acts on.
        os.write(2, token + b"\n")
        os.write(1, token + b" " + json.dumps({"code": code, "clean": clean}).encode() + b"\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:
        serve()
    else:
        main()
