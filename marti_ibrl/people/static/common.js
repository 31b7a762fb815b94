// What both pages of marti-ibrl play / annotate share: the link's token, element lookup, the notice line, the
// server's limits and the JSON API call (its error message shown as the server wrote it). LIMITS ({message: characters,
// body: bytes}) is defined by the server above this file: the same limits it enforces (413 / 422), checked here first.
const token = new URLSearchParams(location.search).get("token") || "";
const $ = (id) => document.getElementById(id);
function say(msg, isError) { $("error").textContent = isError ? msg : ""; $("notice").textContent = isError ? "" : msg; }
function tooLong(what, text) {  // the server's 422 message, before sending; null when the text fits
  const n = [...text].length, fmt = (x) => x.toLocaleString("en-US");
  return n > LIMITS.message ? `${what} too long: ${fmt(n)} characters, at most ${fmt(LIMITS.message)}: shorten it and send it again` : null;
}
async function api(path, body) {
  const opts = { method: body === undefined ? "GET" : "POST", headers: { "X-Token": token, "Content-Type": "application/json" } };
  if (body !== undefined) opts.body = JSON.stringify(body);
  if (opts.body && new Blob([opts.body]).size > LIMITS.body) throw new Error(`too much to send: over ${LIMITS.body.toLocaleString("en-US")} bytes`);
  const r = await fetch(path, opts);
  let data = {};
  try { data = await r.json(); } catch (e) { data = { error: "the server answered " + r.status }; }
  if (!r.ok) throw new Error(data.error || ("error " + r.status));
  return data;
}
