// What both pages of marti-ibrl play / annotate share: the link's token, element lookup, the notice line and the
// JSON API call (its error message shown as the server wrote it).
const token = new URLSearchParams(location.search).get("token") || "";
const $ = (id) => document.getElementById(id);
function say(msg, isError) { $("error").textContent = isError ? msg : ""; $("notice").textContent = isError ? "" : msg; }
async function api(path, body) {
  const opts = { method: body === undefined ? "GET" : "POST", headers: { "X-Token": token, "Content-Type": "application/json" } };
  if (body !== undefined) opts.body = JSON.stringify(body);
  const r = await fetch(path, opts);
  let data = {};
  try { data = await r.json(); } catch (e) { data = { error: "the server answered " + r.status }; }
  if (!r.ok) throw new Error(data.error || ("error " + r.status));
  return data;
}
