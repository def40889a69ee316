// Relay bootstrap for runtime: node (DESIGN.md "Handler contract").
// RELAY_HANDLER is "module.function": require module from the app directory
// (the working directory) and call function with the event parsed from stdin,
// awaiting a returned promise. A throw or rejection exits non-zero.
const path = require("path");
const handler = process.env.RELAY_HANDLER;
const dot = handler.lastIndexOf(".");
const mod = require(path.join(process.cwd(), handler.slice(0, dot)));
const fn = handler.slice(dot + 1);
const chunks = [];
process.stdin.on("data", (c) => chunks.push(c));
process.stdin.on("end", async () => {
  const event = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  if (typeof mod[fn] !== "function") {
    throw new TypeError(`${handler}: not a function`);
  }
  await mod[fn](event);
});
