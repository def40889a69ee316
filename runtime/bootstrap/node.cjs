// Relay bootstrap for `runtime: node` (docs/runtimes.md; docs/apps.md
// "The handler contract"). The containerd runner mounts this file read-only at
// /relay/bootstrap.cjs and runs `node /relay/bootstrap.cjs` with the app
// directory (/app) as working directory.
//
// RELAY_HANDLER is "module.function", split at the last dot. The module part
// is a path relative to the app directory ("events", "lib/events"), looked up
// as <module>.mjs, <module>.cjs, <module>.js, then <module>/index.{mjs,cjs,js},
// and loaded with import(): ES modules and CommonJS both work, and a .js
// file follows the "type" of the nearest package.json. The function is the
// module's export of that name (for CommonJS, a property of module.exports)
// and is called with the event parsed from stdin (JSON); a returned promise
// is awaited. Its value is ignored, and the process exits as soon as it
// settles, even if timers or sockets are still open.
//
// Exit codes:
//   0    the function returned (or its promise resolved)
//   1    the function threw (or its promise rejected), or the module threw
//        while loading: the stack is on stderr, then a last line naming
//        the error
//   2    RELAY_HANDLER is missing or malformed, or stdin is not JSON
//   65   the function threw (or rejected with) an error whose relayPermanent
//        property is true: a permanent failure, not retried
//        (docs/delivery.md#permanent-failures)
//   127  the module or the function does not exist (message on stderr)
//
// Warm mode (`warm: true`; argv "--warm"): the process serves invocations
// one at a time until stdin ends. Each request is one line of JSON on stdin,
//   {"token": T, "handler": "module.function", "env": {...}, "event": "<JSON text>"}
// and each outcome is the line `T {"code": N, "clean": B}` on stdout, N
// being the exit code a one-shot run would have had, after the line `T` on
// stderr. T is a random token the runner makes for each request: the runner
// finds the frames by it, anywhere in the byte streams, so handler output
// (written to pipes synchronously, hence before the frames) can never be
// taken for one. process.env is reset to its initial content plus "env"
// before each call; loaded modules stay in Node's cache (that is the point).
// Processes do not carry over: after each call the bootstrap, which is the
// container's init (PID 1), kills every other process of the container; B
// is true when none is left, and false tells the runner to replace the
// container (Node reaps only the children it started itself, so an orphaned
// grandchild stays a zombie: docs/runtimes.md "Warm containers"). A handler
// must not read process.stdin, which carries the requests; process.exit()
// in a handler ends the container, with that exit code as the outcome.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const util = require("node:util");
const { pathToFileURL } = require("node:url");

const EXIT_FAILED = 1;
const EXIT_USAGE = 2;
const EXIT_PERMANENT = 65;
const EXIT_NOT_FOUND = 127;

const EXTENSIONS = [".mjs", ".cjs", ".js"];

// Thrown to end the bootstrap with an exit code and a message.
class Exit extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// resolveModule returns the file of module name under appDir, or null.
function resolveModule(appDir, name) {
  const base = path.resolve(appDir, name);
  if (base !== appDir && !base.startsWith(appDir + path.sep)) {
    return null; // outside the app directory
  }
  const candidates = [
    ...EXTENSIONS.map((ext) => base + ext),
    ...EXTENSIONS.map((ext) => path.join(base, "index" + ext)),
  ];
  return candidates.find((file) => {
    try {
      return fs.statSync(file).isFile();
    } catch {
      return false;
    }
  }) ?? null;
}

// exported returns the export fn of a module namespace: a named export, or
// for CommonJS whose exports Node could not list statically, an own
// property of module.exports (the namespace's default).
function exported(ns, fn) {
  if (fn in ns && fn !== "default") {
    return ns[fn];
  }
  const def = ns.default;
  if (def !== null && (typeof def === "object" || typeof def === "function") && Object.hasOwn(def, fn)) {
    return def[fn];
  }
  return undefined;
}

// loadModule returns the namespace of the module in file. CommonJS is
// loaded with require, which spares a one-shot run the start of the ES
// module loader (docs/runtimes.md "Node (`runtime: node`)"); an ES module
// (.mjs, or .js under "type": "module") goes through import(). require
// refuses an ES module before running any of it, and names the file.
async function loadModule(file) {
  if (!file.endsWith(".mjs")) {
    try {
      const m = require(file);
      // Node 22 can require an ES module: that gives its namespace.
      return Object.prototype.toString.call(m) === "[object Module]" ? m : { default: m };
    } catch (err) {
      const esm = err && (err.code === "ERR_REQUIRE_ESM" || err.code === "ERR_REQUIRE_ASYNC_MODULE");
      if (!esm || !String(err.message).includes(file)) {
        throw err;
      }
    }
  }
  return import(pathToFileURL(file).href);
}

async function load(handler, appDir) {
  const dot = handler.lastIndexOf(".");
  const moduleName = handler.slice(0, dot);
  const fnName = handler.slice(dot + 1);
  if (dot <= 0 || fnName === "") {
    throw new Exit(EXIT_USAGE, `RELAY_HANDLER=${JSON.stringify(handler)} is not module.function`);
  }
  const file = resolveModule(appDir, moduleName);
  if (file === null) {
    throw new Exit(EXIT_NOT_FOUND,
      `handler ${handler}: module ${JSON.stringify(moduleName)} not found in ${appDir} ` +
      `(looked for ${moduleName}{${EXTENSIONS.join(",")}} and ${moduleName}/index{${EXTENSIONS.join(",")}})`);
  }
  const ns = await loadModule(file);
  const fn = exported(ns, fnName);
  if (fn === undefined) {
    throw new Exit(EXIT_NOT_FOUND,
      `handler ${handler}: module ${path.relative(appDir, file)} has no export ${JSON.stringify(fnName)}`);
  }
  if (typeof fn !== "function") {
    throw new Exit(EXIT_NOT_FOUND,
      `handler ${handler}: export ${JSON.stringify(fnName)} of ${path.relative(appDir, file)} is ${typeof fn}, not a function`);
  }
  return fn;
}

async function readEvent() {
  const chunks = [];
  for await (const chunk of process.stdin) {
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (err) {
    throw new Exit(EXIT_USAGE, `stdin is not a JSON event: ${err.message.replace(/\s+/g, " ")}`);
  }
}

// report prints err's stack without this bootstrap's frames, then one line
// naming the error: the line Relay keeps as the failure's reason.
function report(handler, err) {
  const self = __filename;
  if (err instanceof Error && typeof err.stack === "string") {
    const stack = err.stack.split("\n").filter((line) => !line.includes(self)).join("\n");
    process.stderr.write(stack + "\n");
    process.stderr.write(`relay: handler ${handler} failed: ${err.name}: ${err.message.split("\n")[0]}\n`);
  } else {
    process.stderr.write(`relay: handler ${handler} failed: thrown ${util.inspect(err)}\n`);
  }
}

// invoke runs handler with the event that readEvent returns, and returns the
// exit code of the outcome.
async function invoke(handler, appDir, readEvent) {
  try {
    const fn = await load(handler, appDir);
    const event = await readEvent();
    await fn(event);
  } catch (err) {
    if (err instanceof Exit) {
      process.stderr.write(`relay: ${err.message}\n`);
      return err.code;
    }
    report(handler, err);
    return err !== null && typeof err === "object" && err.relayPermanent === true ? EXIT_PERMANENT : EXIT_FAILED;
  }
  return 0;
}

function main() {
  return invoke(process.env.RELAY_HANDLER ?? "", process.cwd(), readEvent);
}

function parseEvent(text) {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Exit(EXIT_USAGE, `the event is not JSON: ${err.message.replace(/\s+/g, " ")}`);
  }
}

// How long a warm invocation's leftover processes may take to die before
// the bootstrap gives up and has the container replaced, and how long only
// zombies may remain before it takes them for orphans it cannot reap and
// gives up at once. A zombie of a child Node started lasts until libuv
// handles its SIGCHLD, which on a loaded machine takes well over 50 ms.
const CLEAN_UP_MS = 2000;
const ZOMBIES_ONLY_MS = 500;

// otherProcesses lists the container's processes other than this one (the
// container has a PID namespace and a /proc of its own), each with whether
// it is a zombie whose parent is this process, which only this process
// could reap.
function otherProcesses() {
  const out = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) {
      continue;
    }
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${name}/stat`, "latin1");
    } catch {
      continue; // gone meanwhile
    }
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    out.push({ pid: Number(name), ownZombie: state === "Z" && Number(ppid) === process.pid });
  }
  return out;
}

// cleanUp kills every process of the container but this one, so that the
// next invocation starts with the process table of the first, and resolves
// to whether none is left. libuv reaps the children Node started; it is
// given turns of the event loop to do so. Only as the container's init:
// anywhere else kill(-1) would reach every process of the user.
async function cleanUp() {
  if (process.pid !== 1) {
    return false;
  }
  const deadline = Date.now() + CLEAN_UP_MS;
  let zombiesSince = null;
  let pause = 1;
  try {
    for (;;) {
      try {
        process.kill(-1, "SIGKILL"); // everything in the PID namespace but us
      } catch (err) {
        if (err.code !== "ESRCH") {
          return false;
        }
      }
      const left = otherProcesses();
      if (left.length === 0) {
        return true;
      }
      const now = Date.now();
      if (left.every((p) => p.ownZombie)) {
        zombiesSince ??= now;
        if (now - zombiesSince >= ZOMBIES_ONLY_MS) {
          return false; // orphans Node cannot wait for
        }
      } else {
        zombiesSince = null;
      }
      if (now >= deadline) {
        return false;
      }
      await new Promise((resolve) => setTimeout(resolve, pause));
      pause = Math.min(pause * 2, 20);
    }
  } catch {
    return false;
  }
}

async function serve() {
  const readline = require("node:readline");
  const appDir = process.cwd();
  process.argv.splice(2);
  const baseline = { ...process.env };
  const requests = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of requests) {
    const req = JSON.parse(line);
    for (const name of Object.keys(process.env)) {
      if (!Object.hasOwn(baseline, name)) {
        delete process.env[name];
      }
    }
    Object.assign(process.env, baseline, req.env);
    const code = await invoke(req.handler, appDir, async () => parseEvent(req.event));
    const clean = await cleanUp();
    // Writes to pipes are synchronous: the handler's output is out already.
    process.stderr.write(req.token + "\n");
    process.stdout.write(req.token + " " + JSON.stringify({ code, clean }) + "\n");
  }
  return 0; // stdin closed: the runner is done with this container
}

// Output to pipes is written synchronously on Linux, so nothing is lost by
// exiting at once; waiting for the event loop to drain would let a stray
// timer or keep-alive socket hold the invocation until its timeout.
(process.argv[2] === "--warm" ? serve() : main()).then((code) => process.exit(code));
